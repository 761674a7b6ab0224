-- Safe change: a deploy that changes what a job produces builds new dataset versions beside the
-- live ones, then cuts over (or rolls back) every pointer and the active dag_version in one
-- transaction.

-- building: being rebuilt, not served; complete: servable; abandoned: superseded before cutover.
ALTER TABLE dataset_versions ADD COLUMN state TEXT NOT NULL DEFAULT 'complete'
  CHECK (state IN ('building', 'complete', 'abandoned'));

-- building -> active -> retired; or building -> abandoned; or active -> rolled_back.
ALTER TABLE dag_versions ADD COLUMN state TEXT NOT NULL DEFAULT 'retired'
  CHECK (state IN ('building', 'active', 'retired', 'rolled_back', 'abandoned'));
ALTER TABLE dag_versions ADD COLUMN manual_cutover BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE dag_versions ADD COLUMN activated_at TIMESTAMPTZ;
UPDATE dag_versions v SET state = 'active', activated_at = v.deployed_at
FROM dags d WHERE d.dag_id = v.dag_id AND d.active_version = v.version;

-- The version being built while active_version keeps serving (NULL: no rebuild in flight).
ALTER TABLE dags ADD COLUMN building_version INT;

-- What every job of every DAG version writes: each output's dataset version, and the version
-- whose deploy cut it (the job's lineage; it also keys the job's operator state).
CREATE TABLE dag_version_outputs (
  dag_id           UUID NOT NULL REFERENCES dags,
  dag_version      INT NOT NULL,
  job              TEXT NOT NULL,
  dataset_uuid     UUID NOT NULL REFERENCES datasets,
  dataset_version  UUID NOT NULL REFERENCES dataset_versions,
  PRIMARY KEY (dag_id, dag_version, dataset_uuid)
);
CREATE INDEX dag_version_outputs_version_idx ON dag_version_outputs (dataset_version);

CREATE TABLE dag_version_jobs (
  dag_id         UUID NOT NULL REFERENCES dags,
  dag_version    INT NOT NULL,
  job            TEXT NOT NULL,
  since_version  INT NOT NULL,   -- 0: cut before lineage was recorded
  PRIMARY KEY (dag_id, dag_version, job)
);

-- Installs from before: the active version writes what is current now.
INSERT INTO dag_version_outputs (dag_id, dag_version, job, dataset_uuid, dataset_version)
SELECT d.dag_id, d.active_version, ds.producer_job, ds.dataset_uuid, c.dataset_version
FROM dags d
JOIN datasets ds ON ds.producer_dag_id = d.dag_id
JOIN dataset_current c ON c.dataset_uuid = ds.dataset_uuid
WHERE d.active_version IS NOT NULL;
INSERT INTO dag_version_jobs (dag_id, dag_version, job, since_version)
SELECT d.dag_id, d.active_version, j.job, 0
FROM dags d
JOIN dag_versions v ON v.dag_id = d.dag_id AND v.version = d.active_version
CROSS JOIN LATERAL jsonb_object_keys(v.spec -> 'jobs') AS j(job);

-- Operator state belongs to a job's lineage: a rebuild starts afresh while the live version
-- keeps its own.
ALTER TABLE operator_state ADD COLUMN lineage INT NOT NULL DEFAULT 0;
ALTER TABLE operator_state DROP CONSTRAINT operator_state_pkey;
ALTER TABLE operator_state ADD PRIMARY KEY (org_id, dag_id, job, lineage);

-- Every output commit says which dag_version ran it.
ALTER TABLE dataset_commits ADD COLUMN dag_version INT;

-- A deploy's rebuild is a run of its own.
ALTER TABLE trigger_fires DROP CONSTRAINT trigger_fires_kind_check;
ALTER TABLE trigger_fires ADD CONSTRAINT trigger_fires_kind_check
  CHECK (kind IN ('cron', 'webhook', 'manual', 'deploy', 'rollback'));

-- Replays read what a dataset holds (its events) and what a job consumed (its tasks).
CREATE INDEX events_dataset_idx ON events (dataset_uuid, created_at);
CREATE INDEX task_registry_job_idx ON task_registry (dag_id, dag_version, job);

-- Files and tables no committed version points at any more: deleted by the collector only once
-- no query pinned before their retirement can still be reading them.
CREATE TABLE retired_locations (
  id          BIGSERIAL PRIMARY KEY,
  org_id      UUID NOT NULL,
  backend     TEXT NOT NULL CHECK (backend IN ('parquet', 'postgres')),
  location    TEXT NOT NULL,   -- object-store prefix, or "schema.table"
  reason      TEXT NOT NULL CHECK (reason IN ('superseded', 'purged')),
  retired_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  deleted_at  TIMESTAMPTZ
);
CREATE INDEX retired_locations_pending_idx ON retired_locations (retired_at) WHERE deleted_at IS NULL;
