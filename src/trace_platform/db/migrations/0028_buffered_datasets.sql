-- Buffered Postgres datasets: multi-writer tables that untrusted tasks never write directly.
-- A producer's wrapper publishes a pointer to a batch artifact (`buffer_records`, with its
-- outbox row in the same transaction); the trusted sink loads it into the dataset's table.
--
-- The dataset itself is a `datasets` row (backend postgres, one version that never changes,
-- so deploys and rollbacks never move its pointer and its rows stay), declared by one DAG
-- (producer_job 'buffered:<name>': no job has a colon in its name).

CREATE TABLE buffered_datasets (
  dataset_uuid   UUID PRIMARY KEY REFERENCES datasets,
  org_id         UUID NOT NULL REFERENCES orgs,
  name           TEXT NOT NULL,
  owner_dag_id   UUID NOT NULL REFERENCES dags,
  columns        JSONB NOT NULL,          -- [{name, type, required}], as declared
  unique_key     TEXT[] NOT NULL,
  writers        TEXT[] NOT NULL,         -- 'dag.job' of every job allowed to publish
  max_rows       INT NOT NULL,            -- per batch
  max_bytes      BIGINT NOT NULL,         -- per batch artifact
  table_name     TEXT NOT NULL,           -- dataset_<hex>.v_<hex>
  queue_name     TEXT NOT NULL,           -- its own queue: one sink backlog per dataset
  created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
  UNIQUE (org_id, name)
);

-- pending -> loaded | dead. A publish of the same artifact again answers the same record.
CREATE TABLE buffer_records (
  record_id       UUID PRIMARY KEY,
  dataset_uuid    UUID NOT NULL REFERENCES buffered_datasets,
  org_id          UUID NOT NULL,          -- the trusted org: the sink writes rows under it
  task_id         UUID NOT NULL,
  attempt         INT NOT NULL,
  start_day       SMALLINT NOT NULL,
  dag_id          UUID,
  job             TEXT NOT NULL,
  location        TEXT NOT NULL,          -- the artifact's key, below the attempt's prefix
  content_type    TEXT NOT NULL CHECK (content_type IN ('application/jsonl',
                                                        'application/vnd.apache.parquet')),
  status          TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'loaded', 'dead')),
  rows_loaded     BIGINT,                 -- rows new to the table (the rest were duplicates)
  rows_read       BIGINT,
  error           TEXT,                   -- why a dead batch was refused, for its user
  sink_attempts   INT NOT NULL DEFAULT 0,
  created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  finished_at     TIMESTAMPTZ,
  collectable_at  TIMESTAMPTZ,            -- its artifact may be deleted from then on
  UNIQUE (dataset_uuid, location)
);
CREATE INDEX buffer_records_dataset_idx ON buffer_records (dataset_uuid, created_at);
CREATE INDEX buffer_records_task_idx ON buffer_records (task_id);
