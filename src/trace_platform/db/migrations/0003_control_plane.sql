-- Control plane: identity, DAGs and their versions, the dataset registry, worker pools,
-- secrets and trigger fires.

CREATE TABLE orgs (
  org_id      UUID PRIMARY KEY,
  name        TEXT NOT NULL UNIQUE,
  created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE users (
  user_id     UUID PRIMARY KEY,
  org_id      UUID NOT NULL REFERENCES orgs,
  name        TEXT NOT NULL,
  is_admin    BOOLEAN NOT NULL DEFAULT false,
  roles       TEXT[] NOT NULL DEFAULT '{}',
  created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  UNIQUE (org_id, name)
);

-- Bearer tokens, stored only as SHA-256 digests.
CREATE TABLE api_keys (
  key_id      UUID PRIMARY KEY,
  user_id     UUID NOT NULL REFERENCES users,
  key_hash    TEXT NOT NULL UNIQUE,
  prefix      TEXT NOT NULL,
  created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  revoked_at  TIMESTAMPTZ
);

CREATE TABLE dags (
  dag_id          UUID PRIMARY KEY,
  org_id          UUID NOT NULL REFERENCES orgs,
  name            TEXT NOT NULL,
  active_version  INT,
  paused          BOOLEAN NOT NULL DEFAULT false,
  owner_user_id   UUID NOT NULL REFERENCES users,
  deploy_roles    TEXT[] NOT NULL DEFAULT '{}',   -- admin-managed, never in the DAG file
  created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  UNIQUE (org_id, name)
);

-- Immutable: one row per deploy.
CREATE TABLE dag_versions (
  dag_id       UUID NOT NULL REFERENCES dags,
  version      INT NOT NULL,
  spec         JSONB NOT NULL,
  source_yaml  TEXT NOT NULL,
  checksum     TEXT NOT NULL,
  deployed_by  UUID NOT NULL REFERENCES users,
  deployed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (dag_id, version)
);

-- Every job output is a dataset (published ones have a name); identity is stable across deploys.
CREATE TABLE datasets (
  dataset_uuid           UUID PRIMARY KEY,
  org_id                 UUID NOT NULL REFERENCES orgs,
  dataset_name           TEXT CHECK (dataset_name ~ '^[a-z][a-z0-9_]{0,127}$'),
  backend                TEXT NOT NULL CHECK (backend IN ('parquet', 'postgres')),
  location               TEXT NOT NULL,
  update_strategy        TEXT NOT NULL CHECK (update_strategy IN ('replace', 'append')),
  unique_key             TEXT[] NOT NULL DEFAULT '{}',
  producer_dag_id        UUID NOT NULL REFERENCES dags,
  producer_job           TEXT NOT NULL,
  producer_output_index  INT NOT NULL,
  read_roles             TEXT[] NOT NULL DEFAULT '{}',
  created_at             TIMESTAMPTZ NOT NULL DEFAULT now(),
  UNIQUE (org_id, dataset_name),
  UNIQUE (producer_dag_id, producer_job, producer_output_index)
);

CREATE TABLE dataset_versions (
  dataset_version  UUID PRIMARY KEY,
  dataset_uuid     UUID NOT NULL REFERENCES datasets,
  dag_id           UUID NOT NULL REFERENCES dags,
  dag_version      INT NOT NULL,
  location         TEXT NOT NULL,
  created_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX dataset_versions_dataset_idx ON dataset_versions (dataset_uuid, created_at);

-- The "current" pointer: swapped atomically, never mutated in place.
CREATE TABLE dataset_current (
  dataset_uuid     UUID PRIMARY KEY REFERENCES datasets,
  dataset_version  UUID NOT NULL REFERENCES dataset_versions,
  updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Output commits from tasks (attempt-fenced by the Dispatcher before they land here).
CREATE TABLE dataset_commits (
  commit_id        UUID PRIMARY KEY,
  dataset_uuid     UUID NOT NULL REFERENCES datasets,
  dataset_version  UUID NOT NULL REFERENCES dataset_versions,
  task_id          UUID NOT NULL,
  attempt          INT NOT NULL,
  scope            TEXT NOT NULL,   -- 'partition:…' | 'range:a-b' | 'all'
  partition_key    TEXT,
  range_start      BIGINT,
  range_end        BIGINT,
  location         TEXT,
  row_count        BIGINT,
  byte_count       BIGINT,
  created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
  UNIQUE (dataset_version, scope)
);

-- Which job of which DAG version consumes which dataset: the event fan-out index.
CREATE TABLE dag_subscriptions (
  dag_id        UUID NOT NULL REFERENCES dags,
  dag_version   INT NOT NULL,
  job           TEXT NOT NULL,
  input_index   INT NOT NULL,
  dataset_uuid  UUID NOT NULL REFERENCES datasets,
  PRIMARY KEY (dag_id, dag_version, job, input_index)
);
CREATE INDEX dag_subscriptions_dataset_idx ON dag_subscriptions (dataset_uuid);

-- Worker pool slots; a running task holds at most one.
CREATE TABLE pool_slots (
  dag_id          UUID NOT NULL REFERENCES dags,
  pool            TEXT NOT NULL,
  slot_index      INT NOT NULL,
  env             JSONB NOT NULL DEFAULT '{}',
  secrets         JSONB NOT NULL DEFAULT '{}',
  retired         BOOLEAN NOT NULL DEFAULT false,
  leased_by_task  UUID,
  leased_job      TEXT,
  leased_at       TIMESTAMPTZ,
  PRIMARY KEY (dag_id, pool, slot_index)
);
CREATE UNIQUE INDEX pool_slots_task_idx ON pool_slots (leased_by_task) WHERE leased_by_task IS NOT NULL;

CREATE TABLE secrets (
  org_id      UUID NOT NULL REFERENCES orgs,
  name        TEXT NOT NULL CHECK (name ~ '^[A-Za-z_][A-Za-z0-9_.-]{0,127}$'),
  value       TEXT NOT NULL,
  updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, name)
);

-- One row per trigger firing; the unique key makes each (trigger, fire time) fire once.
CREATE TABLE trigger_fires (
  run_id       UUID PRIMARY KEY,
  dag_id       UUID NOT NULL REFERENCES dags,
  dag_version  INT NOT NULL,
  trigger      TEXT NOT NULL,      -- cron/webhook name, or 'manual'
  kind         TEXT NOT NULL CHECK (kind IN ('cron', 'webhook', 'manual')),
  fire_key     TEXT NOT NULL,      -- cron: fire time; webhook/manual: idempotency key
  config       JSONB NOT NULL DEFAULT '{}',
  fired_by     UUID REFERENCES users,
  created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  UNIQUE (dag_id, trigger, fire_key)
);
CREATE INDEX trigger_fires_created_idx ON trigger_fires (created_at);

-- Cron cursor per (dag, trigger): the last fire time handled (catch-up starts after it).
CREATE TABLE cron_state (
  dag_id        UUID NOT NULL REFERENCES dags,
  trigger       TEXT NOT NULL,
  last_fire_at  TIMESTAMPTZ NOT NULL,
  PRIMARY KEY (dag_id, trigger)
);

-- Tasks learn their run, pool and outputs at creation (still immutable afterwards).
ALTER TABLE task_registry ADD COLUMN run_id UUID;
ALTER TABLE task_registry ADD COLUMN worker_pool TEXT;
ALTER TABLE task_registry ADD COLUMN max_concurrency INT;
ALTER TABLE task_registry ADD COLUMN outputs JSONB NOT NULL DEFAULT '[]';
CREATE INDEX task_registry_task_idx ON task_registry (task_id);
CREATE INDEX task_registry_run_idx ON task_registry (run_id) WHERE run_id IS NOT NULL;
CREATE INDEX task_registry_pool_idx ON task_registry (dag_id, worker_pool) WHERE worker_pool IS NOT NULL;
