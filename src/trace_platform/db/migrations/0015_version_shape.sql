-- A dataset version carries the shape it was built with (backend, update strategy, unique key):
-- a rebuild may change them while the live version keeps its own, and every writer and reader
-- of a version follows the version's (the dataset's row says the live shape, for listings).
ALTER TABLE dataset_versions ADD COLUMN backend TEXT CHECK (backend IN ('parquet', 'postgres'));
ALTER TABLE dataset_versions ADD COLUMN update_strategy TEXT
  CHECK (update_strategy IN ('replace', 'append'));
ALTER TABLE dataset_versions ADD COLUMN unique_key TEXT[];
UPDATE dataset_versions v
SET backend = d.backend, update_strategy = d.update_strategy, unique_key = d.unique_key
FROM datasets d WHERE d.dataset_uuid = v.dataset_uuid;

-- A producer's cutover or rollback swaps datasets other DAGs read: their readers re-run over
-- the new history, as a run of their own DAG started by the upstream change.
ALTER TABLE trigger_fires DROP CONSTRAINT trigger_fires_kind_check;
ALTER TABLE trigger_fires ADD CONSTRAINT trigger_fires_kind_check
  CHECK (kind IN ('cron', 'webhook', 'manual', 'deploy', 'rollback', 'upstream'));
