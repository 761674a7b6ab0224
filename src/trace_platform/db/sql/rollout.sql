-- Named queries of safe change: rebuilds beside the live version, cutover, rollback, pause.

-- name: lock_dag
-- Taken exclusive by deploys, cutovers, rollbacks and pauses; event fan-out and trigger fires
-- take it shared (dag_tasks.sql), so each event lands wholly before or wholly after a change.
SELECT pg_advisory_xact_lock(hashtextextended('trace-dag:' || %(dag_id)s::text, 0));

-- name: dag_for_update
SELECT * FROM dags WHERE dag_id = %(dag_id)s FOR UPDATE;

-- name: version_outputs
SELECT o.job, o.dataset_uuid, o.dataset_version, v.state
FROM dag_version_outputs o JOIN dataset_versions v USING (dataset_version)
WHERE o.dag_id = %(dag_id)s AND o.dag_version = %(version)s
ORDER BY o.job, o.dataset_uuid;

-- name: version_jobs
SELECT job, since_version FROM dag_version_jobs
WHERE dag_id = %(dag_id)s AND dag_version = %(version)s
ORDER BY job;

-- name: insert_version_output
INSERT INTO dag_version_outputs (dag_id, dag_version, job, dataset_uuid, dataset_version)
VALUES (%(dag_id)s, %(version)s, %(job)s, %(dataset_uuid)s, %(dataset_version)s);

-- name: insert_version_job
INSERT INTO dag_version_jobs (dag_id, dag_version, job, since_version)
VALUES (%(dag_id)s, %(version)s, %(job)s, %(since_version)s);

-- name: insert_dataset_version
INSERT INTO dataset_versions (dataset_version, dataset_uuid, dag_id, dag_version, location, state,
                              backend, update_strategy, unique_key)
VALUES (%(dataset_version)s, %(dataset_uuid)s, %(dag_id)s, %(dag_version)s, %(location)s, %(state)s,
        %(backend)s, %(update_strategy)s, %(unique_key)s);

-- name: set_version_state
UPDATE dag_versions
SET state = %(state)s,
    activated_at = CASE WHEN %(state)s = 'active' THEN now() ELSE activated_at END
WHERE dag_id = %(dag_id)s AND version = %(version)s;

-- name: set_manual_cutover
UPDATE dag_versions SET manual_cutover = %(manual)s
WHERE dag_id = %(dag_id)s AND version = %(version)s;

-- name: set_building
UPDATE dags SET building_version = %(version)s WHERE dag_id = %(dag_id)s;

-- name: make_active
UPDATE dags SET active_version = %(version)s, building_version = NULL WHERE dag_id = %(dag_id)s;

-- name: set_paused
UPDATE dags SET paused = %(paused)s WHERE dag_id = %(dag_id)s;

-- name: point_current
-- Every output of a DAG version becomes current: the pointer swap of a cutover or rollback.
INSERT INTO dataset_current (dataset_uuid, dataset_version)
SELECT dataset_uuid, dataset_version FROM dag_version_outputs
WHERE dag_id = %(dag_id)s AND dag_version = %(version)s
ON CONFLICT (dataset_uuid) DO UPDATE
SET dataset_version = EXCLUDED.dataset_version, updated_at = now()
WHERE dataset_current.dataset_version <> EXCLUDED.dataset_version
RETURNING dataset_uuid;

-- name: complete_versions
UPDATE dataset_versions SET state = 'complete'
WHERE state = 'building' AND dataset_version IN (
  SELECT dataset_version FROM dag_version_outputs
  WHERE dag_id = %(dag_id)s AND dag_version = %(version)s);

-- name: abandon_versions
UPDATE dataset_versions SET state = 'abandoned'
WHERE state = 'building' AND dataset_version IN (
  SELECT dataset_version FROM dag_version_outputs
  WHERE dag_id = %(dag_id)s AND dag_version = %(version)s);

-- name: release_buffered
-- A version's held work becomes claimable (the caller wakes each task).
UPDATE task_status s
SET status = 'queued', next_attempt_at = now(), updated_at = now()
FROM task_registry r
WHERE s.status = 'buffered' AND r.task_id = s.task_id AND r.start_day = s.start_day
  AND r.dag_id = %(dag_id)s AND r.dag_version = %(version)s
RETURNING s.task_id, s.start_day;

-- name: cancel_work
-- Queued and held work of the given versions (and jobs, if named) ends canceled; running
-- attempts are asked to stop (cooperative cancel). Each task's pool comes back with it: a
-- queued one may have been the task a release woke, whose place another must take.
UPDATE task_status s
SET cancel_requested = true,
    status = CASE WHEN s.status IN ('queued', 'buffered') THEN 'canceled' ELSE s.status END,
    finished_at = CASE WHEN s.status IN ('queued', 'buffered') THEN now() ELSE s.finished_at END,
    last_error = coalesce(s.last_error, %(reason)s),
    updated_at = now()
FROM task_registry r
WHERE s.status IN ('queued', 'buffered', 'running')
  AND r.task_id = s.task_id AND r.start_day = s.start_day
  AND r.dag_id = %(dag_id)s AND r.dag_version = ANY(%(versions)s)
  AND (%(jobs)s::text[] IS NULL OR r.job = ANY(%(jobs)s))
RETURNING s.task_id, s.status, s.pool_dag_id, s.worker_pool, s.whole_job;

-- name: queued_of_dag
-- A resumed DAG's waiting tasks, to wake.
SELECT s.task_id, s.start_day
FROM task_status s
JOIN task_registry r ON r.task_id = s.task_id AND r.start_day = s.start_day
WHERE s.status = 'queued' AND NOT s.cancel_requested AND r.dag_id = %(dag_id)s;

-- name: progress
-- A DAG version's work per job: how much is done, waiting, held, failed.
SELECT r.job,
       count(*) AS tasks,
       count(*) FILTER (WHERE s.status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE s.status IN ('queued', 'running')) AS pending,
       count(*) FILTER (WHERE s.status = 'buffered') AS buffered,
       count(*) FILTER (WHERE s.status = 'failed') AS failed,
       count(*) FILTER (WHERE s.status = 'canceled') AS canceled
FROM task_registry r
JOIN task_status s ON s.task_id = r.task_id AND s.start_day = r.start_day
WHERE r.dag_id = %(dag_id)s AND r.dag_version = %(version)s
GROUP BY r.job
ORDER BY r.job;

-- name: building_dags
-- Rebuilds in flight that cut over by themselves.
SELECT d.dag_id, d.building_version
FROM dags d JOIN dag_versions v ON v.dag_id = d.dag_id AND v.version = d.building_version
WHERE NOT v.manual_cutover AND NOT d.paused;

-- name: replay_events
-- What a dataset holds at a version, as events: the newest event per scope from the tasks that
-- wrote that version, less those a task of `job` writing `target` already consumed (tasks of
-- `versions`: the DAG versions sharing the job's lineage, so the lookup stays on an index).
SELECT x.*
FROM (
  SELECT DISTINCT ON (e.dedupe_key)
         e.event_id, e.producer_task_id, e.dataset_uuid, e.cursor, e.partition_key,
         e.range_start, e.range_end, e.payload, e.created_at
  FROM events e
  JOIN task_registry r ON r.task_id = e.producer_task_id AND r.start_day = e.start_day
  WHERE e.dataset_uuid = %(dataset_uuid)s AND r.outputs @> %(written)s
  ORDER BY e.dedupe_key, e.created_at DESC
) AS x
WHERE NOT %(check_consumed)s OR NOT EXISTS (
  SELECT 1 FROM task_registry t JOIN task_status ts ON ts.task_id = t.task_id
  WHERE t.dag_id = %(dag_id)s AND t.dag_version = ANY(%(versions)s) AND t.job = %(job)s
    AND t.input_event_id = x.event_id
    AND t.outputs @> %(target)s AND ts.status <> 'canceled')
ORDER BY x.range_start NULLS LAST, x.created_at, x.partition_key, x.cursor, x.event_id;

-- name: replay_fires
-- The trigger firings a source job replays: every webhook and manual one (each carries its own
-- config), and only the latest cron tick (a tick says "run now"; the job's state says from
-- where), less those a task of `job` writing `target` already consumed.
SELECT f.run_id, f.trigger, f.kind, f.fire_key, f.config, f.created_at
FROM trigger_fires f
WHERE f.dag_id = %(dag_id)s
  AND (f.kind IN ('webhook', 'manual')
       OR (f.kind = 'cron' AND f.created_at = (SELECT max(created_at) FROM trigger_fires
                                              WHERE dag_id = %(dag_id)s AND kind = 'cron')))
  AND (NOT %(check_consumed)s OR NOT EXISTS (
    SELECT 1 FROM task_registry t JOIN task_status ts ON ts.task_id = t.task_id
    WHERE t.dag_id = %(dag_id)s AND t.dag_version = ANY(%(versions)s) AND t.job = %(job)s
      AND t.run_id = f.run_id
      AND t.outputs @> %(target)s AND ts.status <> 'canceled'))
ORDER BY f.created_at;

-- name: insert_change_run
INSERT INTO trigger_fires (run_id, dag_id, dag_version, trigger, kind, fire_key, config, fired_by)
VALUES (%(run_id)s, %(dag_id)s, %(dag_version)s, %(kind)s, %(kind)s, %(fire_key)s, %(config)s, %(fired_by)s);

-- name: dag_versions
SELECT version, state, deployed_at, activated_at, manual_cutover, checksum
FROM dag_versions WHERE dag_id = %(dag_id)s ORDER BY version DESC;

-- name: dataset_status
-- Per output of a DAG version: the dataset, its version in the map, that version's state and
-- how much it holds, and whether it is current.
SELECT o.job, o.dataset_uuid, ds.dataset_name, ds.producer_output_index, o.dataset_version,
       v.state, (c.dataset_version = o.dataset_version) AS current,
       (SELECT count(*) FROM dataset_commits dc WHERE dc.dataset_version = o.dataset_version) AS commits,
       (SELECT coalesce(sum(row_count), 0) FROM dataset_commits dc
        WHERE dc.dataset_version = o.dataset_version) AS row_count
FROM dag_version_outputs o
JOIN datasets ds ON ds.dataset_uuid = o.dataset_uuid
JOIN dataset_versions v ON v.dataset_version = o.dataset_version
LEFT JOIN dataset_current c ON c.dataset_uuid = o.dataset_uuid
WHERE o.dag_id = %(dag_id)s AND o.dag_version = %(version)s
ORDER BY o.job, ds.producer_output_index;

-- name: current_of
SELECT dataset_uuid, dataset_version FROM dataset_current WHERE dataset_uuid = ANY(%(datasets)s);

-- name: shared_readers
-- Other DAGs' live jobs woken by these datasets: after a swap they re-run over the new history.
SELECT s.dag_id, array_agg(DISTINCT s.job ORDER BY s.job) AS jobs
FROM dag_subscriptions s
JOIN dags d ON d.dag_id = s.dag_id AND s.dag_version = d.active_version
WHERE s.dataset_uuid = ANY(%(datasets)s) AND s.dag_id <> %(dag_id)s AND s.triggers
GROUP BY s.dag_id
ORDER BY s.dag_id;

-- name: lineage_versions
-- The DAG versions whose job `job` shares the lineage `since` (they write the same outputs).
SELECT dag_version FROM dag_version_jobs
WHERE dag_id = %(dag_id)s AND job = %(job)s AND since_version = %(since)s;
