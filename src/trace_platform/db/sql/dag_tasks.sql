-- Named queries that turn triggers and events into the tasks of DAG jobs.

-- name: version_spec
SELECT spec FROM dag_versions WHERE dag_id = %(dag_id)s AND version = %(version)s;

-- name: job_outputs
-- What the job writes in this DAG version: each output's dataset version from the version's map.
SELECT ds.dataset_uuid, ds.producer_output_index AS output_index,
       coalesce(v.backend, ds.backend) AS backend, ds.dataset_name, o.dataset_version, v.location
FROM dag_version_outputs o
JOIN datasets ds ON ds.dataset_uuid = o.dataset_uuid
JOIN dataset_versions v ON v.dataset_version = o.dataset_version
WHERE o.dag_id = %(dag_id)s AND o.dag_version = %(version)s AND o.job = %(job)s
ORDER BY ds.producer_output_index;

-- name: job_inputs
-- Each input pinned for the whole life of the task: a dataset of the same DAG at the version
-- this DAG version writes (a rebuild reads what it rebuilds), another DAG's at its current one.
SELECT s.input_index, ds.dataset_uuid, ds.dataset_name, coalesce(v.backend, ds.backend) AS backend,
       coalesce(o.dataset_version, c.dataset_version) AS dataset_version, v.location
FROM dag_subscriptions s
JOIN datasets ds ON ds.dataset_uuid = s.dataset_uuid
LEFT JOIN dag_version_outputs o
  ON o.dag_id = s.dag_id AND o.dag_version = s.dag_version AND o.dataset_uuid = s.dataset_uuid
LEFT JOIN dataset_current c ON c.dataset_uuid = ds.dataset_uuid
LEFT JOIN dataset_versions v ON v.dataset_version = coalesce(o.dataset_version, c.dataset_version)
WHERE s.dag_id = %(dag_id)s AND s.dag_version = %(version)s AND s.job = %(job)s
ORDER BY s.input_index;

-- name: lock_dags_shared
-- Fan-out holds the subscribing DAGs' locks shared, so a deploy, cutover or rollback (which
-- takes them exclusive) sees each event either wholly before it or wholly after.
SELECT pg_advisory_xact_lock_shared(hashtextextended('trace-dag:' || dag_id::text, 0))
FROM (SELECT DISTINCT dag_id FROM dag_subscriptions
      WHERE dataset_uuid = %(dataset_uuid)s ORDER BY dag_id) AS s;

-- name: lock_dag_shared
SELECT pg_advisory_xact_lock_shared(hashtextextended('trace-dag:' || %(dag_id)s::text, 0));

-- name: subscribers
-- Who gets a task for an event on a dataset, written to dataset version `written`:
-- * in the producer's own DAG, each live version (active, building) whose map has exactly that
--   version, so a rebuild's output feeds only the rebuild and a late task of a retired version
--   feeds nobody unless what it wrote is still live;
-- * in other DAGs, the live versions, when `written` is the dataset's current version.
-- A building version gets tasks only for the jobs it rebuilds; they are 'buffered' (held until
-- cutover) unless the event comes from the rebuild itself.
SELECT s.dag_id, s.dag_version, s.job,
       CASE WHEN s.dag_version = d.building_version
                 AND NOT (s.dag_id = %(producer_dag)s AND s.dag_version = %(producer_version)s)
            THEN 'buffered' ELSE 'queued' END AS status
FROM dag_subscriptions s
JOIN dags d ON d.dag_id = s.dag_id
WHERE s.dataset_uuid = %(dataset_uuid)s AND d.org_id = %(org_id)s AND s.triggers
  AND (s.dag_version = d.active_version OR s.dag_version = d.building_version)
  AND CASE WHEN s.dag_id = %(producer_dag)s
           THEN EXISTS (SELECT 1 FROM dag_version_outputs o
                        WHERE o.dag_id = s.dag_id AND o.dag_version = s.dag_version
                          AND o.dataset_uuid = s.dataset_uuid
                          AND o.dataset_version = %(written)s)
           ELSE EXISTS (SELECT 1 FROM dataset_current c
                        WHERE c.dataset_uuid = s.dataset_uuid
                          AND c.dataset_version = %(written)s)
      END
  AND (d.building_version IS NULL OR s.dag_version <> d.building_version
       OR EXISTS (SELECT 1 FROM dag_version_jobs j
                  WHERE j.dag_id = s.dag_id AND j.dag_version = s.dag_version AND j.job = s.job
                    AND j.since_version = s.dag_version))
ORDER BY s.dag_id, s.dag_version, s.job;

-- name: source_jobs
-- The live versions of a DAG a trigger starts: the active one, and a building one for the
-- source jobs it rebuilds (held until cutover).
SELECT v.version, j.job, CASE WHEN v.version = d.building_version THEN 'buffered' ELSE 'queued' END AS status
FROM dags d
JOIN dag_versions v ON v.dag_id = d.dag_id
  AND (v.version = d.active_version OR v.version = d.building_version)
JOIN dag_version_jobs j ON j.dag_id = d.dag_id AND j.dag_version = v.version
WHERE d.dag_id = %(dag_id)s
  AND (v.version = d.active_version OR j.since_version = v.version)
  AND jsonb_array_length(coalesce(v.spec -> 'jobs' -> j.job -> 'inputs', '[]'::jsonb)) = 0
ORDER BY v.version, j.job;

-- name: insert_fire
INSERT INTO trigger_fires (run_id, dag_id, dag_version, trigger, kind, fire_key, config, fired_by)
VALUES (%(run_id)s, %(dag_id)s, %(dag_version)s, %(trigger)s, %(kind)s, %(fire_key)s, %(config)s, %(fired_by)s)
ON CONFLICT (dag_id, trigger, fire_key) DO NOTHING
RETURNING run_id;

-- name: fire_by_key
SELECT run_id FROM trigger_fires
WHERE dag_id = %(dag_id)s AND trigger = %(trigger)s AND fire_key = %(fire_key)s;

-- name: run_tree
-- Lineage of a run: roots of the run (no parent, or a parent in another run: a shared read's
-- producer in another DAG), then every task of the run whose parent is in the tree. A run
-- never reaches past its own DAG: a DAG reading another's data gets runs of its own, and
-- whoever may see (or cancel) this run may not see theirs. Every task of a run starts between
-- the day it fired and today (`first_day`, `last_day`: run_fire's), so each scan of the
-- registry prunes to those days' partitions: today's run touches today's alone; children are
-- created after their parent, so each step also starts at the parent's start_day.
WITH RECURSIVE tree AS (
  SELECT r.task_id, r.parent_task_id, r.start_day, 0 AS depth
  FROM task_registry r
  WHERE r.run_id = %(run_id)s AND r.start_day BETWEEN %(first_day)s AND %(last_day)s
    AND (r.parent_task_id IS NULL
         OR NOT EXISTS (SELECT 1 FROM task_registry p
                        WHERE p.task_id = r.parent_task_id AND p.run_id = %(run_id)s
                          AND p.start_day BETWEEN %(first_day)s AND %(last_day)s))
  UNION ALL
  SELECT c.task_id, c.parent_task_id, c.start_day, t.depth + 1
  FROM tree t
  JOIN task_registry c ON c.parent_task_id = t.task_id
   AND c.start_day BETWEEN t.start_day AND t.start_day + 31
   AND c.start_day BETWEEN %(first_day)s AND %(last_day)s
   AND c.run_id = %(run_id)s
)
SELECT t.task_id, t.parent_task_id, t.depth, r.job, r.operator, r.dag_id, r.created_at,
       s.status, s.cancel_requested, s.attempt, s.started_at, s.finished_at, s.last_error,
       s.progress, s.progress_at
FROM tree t
JOIN task_registry r ON r.task_id = t.task_id AND r.start_day = t.start_day
 AND r.start_day BETWEEN %(first_day)s AND %(last_day)s
JOIN task_status s ON s.task_id = t.task_id
ORDER BY r.created_at;

-- name: list_runs
-- Only runs of `dag_ids`: the DAGs the caller may see (decided by the control plane).
SELECT f.run_id, d.name AS dag, f.dag_version, f.trigger, f.kind, f.created_at,
       count(s.task_id) AS tasks,
       count(*) FILTER (WHERE s.status IN ('queued', 'running', 'buffered')) AS active,
       count(*) FILTER (WHERE s.status = 'failed') AS failed,
       count(*) FILTER (WHERE s.status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE s.status = 'canceled') AS canceled,
       max(s.finished_at) AS finished_at
FROM trigger_fires f
JOIN dags d ON d.dag_id = f.dag_id
LEFT JOIN task_registry r ON r.run_id = f.run_id
LEFT JOIN task_status s ON s.task_id = r.task_id
WHERE d.org_id = %(org_id)s AND d.dag_id = ANY(%(dag_ids)s::uuid[])
  AND (%(dag)s::text IS NULL OR d.name = %(dag)s)
GROUP BY f.run_id, d.name, f.dag_version, f.trigger, f.kind, f.created_at
ORDER BY f.created_at DESC
LIMIT %(limit)s;

-- name: run_fire
-- A run, with the days its tasks may have started on (its fire day to today: run_tree's bounds).
SELECT f.*, d.name AS dag, d.org_id, d.owner_user_id, d.deploy_roles,
       trace_start_day(f.created_at) AS first_day, trace_start_day(now()) AS last_day
FROM trigger_fires f JOIN dags d ON d.dag_id = f.dag_id
WHERE f.run_id = %(run_id)s;

-- name: cron_candidates
SELECT cs.dag_id, cs.trigger, d.active_version
FROM cron_state cs
JOIN dags d ON d.dag_id = cs.dag_id
WHERE d.active_version IS NOT NULL AND NOT d.paused;

-- name: cron_lock
-- Whoever holds the row fires the tick; a second scheduler skips it rather than wait.
SELECT cs.last_fire_at, d.*
FROM cron_state cs JOIN dags d ON d.dag_id = cs.dag_id
WHERE cs.dag_id = %(dag_id)s AND cs.trigger = %(trigger)s
FOR UPDATE OF cs SKIP LOCKED;

-- name: cron_lock_wait
-- An outside scheduler's tick (EventBridge, triggers/cron.py fire_scheduled) waits for the row:
-- skipping it could drop a tick no one else is firing.
SELECT cs.last_fire_at, d.*
FROM cron_state cs JOIN dags d ON d.dag_id = cs.dag_id
WHERE cs.dag_id = %(dag_id)s AND cs.trigger = %(trigger)s
FOR UPDATE OF cs;

-- name: dag_in_org
SELECT d.* FROM dags d JOIN orgs o ON o.org_id = d.org_id
WHERE o.name = %(org)s AND d.name = %(dag)s;

-- name: cron_advance
UPDATE cron_state SET last_fire_at = %(fire_at)s
WHERE dag_id = %(dag_id)s AND trigger = %(trigger)s;

-- name: run_version_state
-- What a run's retry checks: its DAG paused, and the state of the DAG version it fired.
SELECT d.name, d.paused, d.active_version, v.state AS version_state
FROM dags d
LEFT JOIN dag_versions v ON v.dag_id = d.dag_id AND v.version = %(version)s
WHERE d.dag_id = %(dag_id)s;

