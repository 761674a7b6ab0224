-- Buffered Postgres datasets (migration 0028): their registration at deploy, the Dispatcher's
-- buffer records, and what the sink and `trace buffers list` read of them.

-- name: buffered_by_name
SELECT b.*, ds.dataset_name, c.dataset_version
FROM buffered_datasets b
JOIN datasets ds USING (dataset_uuid)
LEFT JOIN dataset_current c USING (dataset_uuid)
WHERE b.org_id = %(org_id)s AND b.name = %(name)s;

-- name: buffered_by_uuid
SELECT b.* FROM buffered_datasets b WHERE b.dataset_uuid = %(dataset_uuid)s;

-- name: insert_dataset
-- The dataset row of a buffered dataset: Postgres, append-only by its unique key; named at
-- once (its name is the declaring DAG's for good; a deploy's unpublish skips it).
INSERT INTO datasets (dataset_uuid, org_id, dataset_name, backend, location, update_strategy,
                      unique_key, producer_dag_id, producer_job, producer_output_index)
VALUES (%(dataset_uuid)s, %(org_id)s, %(name)s, 'postgres', %(location)s, 'append',
        %(unique_key)s, %(dag_id)s, 'buffered:' || %(name)s, 0);

-- name: insert_version
-- Its one version, current for good: deploys and rollbacks never swap it (it is in no DAG
-- version's output map).
WITH v AS (
  INSERT INTO dataset_versions (dataset_version, dataset_uuid, dag_id, dag_version, location,
                                state, backend, update_strategy, unique_key)
  VALUES (%(dataset_version)s, %(dataset_uuid)s, %(dag_id)s, %(dag_version)s, %(table_name)s,
          'complete', 'postgres', 'append', %(unique_key)s)
  RETURNING dataset_version, dataset_uuid
)
INSERT INTO dataset_current (dataset_uuid, dataset_version)
SELECT dataset_uuid, dataset_version FROM v;

-- name: insert_buffered
INSERT INTO buffered_datasets (dataset_uuid, org_id, name, owner_dag_id, columns, unique_key,
                               writers, max_rows, max_bytes, table_name, queue_name)
VALUES (%(dataset_uuid)s, %(org_id)s, %(name)s, %(dag_id)s, %(columns)s, %(unique_key)s,
        %(writers)s, %(max_rows)s, %(max_bytes)s, %(table_name)s, %(queue_name)s);

-- name: update_buffered
-- What a redeploy may change: who writes, and the batch bounds (never the columns or key:
-- the rows already stored keep them).
UPDATE buffered_datasets
SET writers = %(writers)s, max_rows = %(max_rows)s, max_bytes = %(max_bytes)s
WHERE dataset_uuid = %(dataset_uuid)s;

-- name: insert_record
-- A publish: the same artifact published again (a retried call) answers the record it made.
INSERT INTO buffer_records (record_id, dataset_uuid, org_id, task_id, attempt, start_day, dag_id,
                            job, location, content_type)
VALUES (%(record_id)s, %(dataset_uuid)s, %(org_id)s, %(task_id)s, %(attempt)s, %(start_day)s,
        %(dag_id)s, %(job)s, %(location)s, %(content_type)s)
ON CONFLICT (dataset_uuid, location) DO NOTHING
RETURNING record_id;

-- name: record_by_location
SELECT record_id FROM buffer_records
WHERE dataset_uuid = %(dataset_uuid)s AND location = %(location)s;

-- name: record_for_sink
-- The record and its dataset, locked: one sink lands it (another waits, then sees it done).
SELECT r.*, b.columns, b.unique_key, b.max_rows, b.max_bytes, b.table_name, b.name,
       b.platform, c.dataset_version
FROM buffer_records r
JOIN buffered_datasets b USING (dataset_uuid)
LEFT JOIN dataset_current c USING (dataset_uuid)
WHERE r.record_id = %(record_id)s
FOR UPDATE OF r;

-- name: count_sink_attempt
UPDATE buffer_records SET sink_attempts = sink_attempts + 1
WHERE record_id = %(record_id)s AND status = 'pending'
RETURNING sink_attempts;

-- name: mark_loaded
-- Landed: its artifact may be collected from now on.
UPDATE buffer_records
SET status = 'loaded', rows_read = %(rows_read)s, rows_loaded = %(rows_loaded)s,
    finished_at = now(), collectable_at = now(), error = NULL
WHERE record_id = %(record_id)s AND status = 'pending';

-- name: note_error
-- Why the last try of a still pending record failed: the reason its dead letter gives if the
-- tries run out.
UPDATE buffer_records SET error = %(error)s
WHERE record_id = %(record_id)s AND status = 'pending';

-- name: mark_dead
UPDATE buffer_records
SET status = 'dead', error = %(error)s, finished_at = now(), collectable_at = now()
WHERE record_id = %(record_id)s AND status = 'pending';

-- name: buffered_datasets
-- What a sink serves: every buffered dataset, or the named ones (of any org).
SELECT b.dataset_uuid, b.org_id, b.name, b.columns, b.unique_key, b.table_name, b.queue_name
FROM buffered_datasets b
WHERE cardinality(%(names)s::text[]) = 0 OR b.name = ANY (%(names)s::text[])
ORDER BY b.created_at;

-- name: list_records
-- Newest first, the org's, of the named datasets (those its reader may read); optionally one
-- dataset, one status.
SELECT r.record_id, b.name AS dataset, r.status, r.task_id, r.attempt, r.job,
       d.name AS dag, r.location, r.rows_read, r.rows_loaded, r.error, r.sink_attempts,
       r.created_at, r.finished_at
FROM buffer_records r
JOIN buffered_datasets b USING (dataset_uuid)
LEFT JOIN dags d ON d.dag_id = r.dag_id
WHERE r.org_id = %(org_id)s
  AND (%(datasets)s::text[] IS NULL OR b.name = ANY (%(datasets)s::text[]))
  AND (%(dataset)s::text IS NULL OR b.name = %(dataset)s)
  AND (%(status)s::text IS NULL OR r.status = %(status)s)
ORDER BY r.created_at DESC, r.record_id
LIMIT %(limit)s;
