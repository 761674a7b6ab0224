-- Named queries that turn triggers and events into the tasks of DAG jobs.

-- name: version_spec
SELECT spec FROM dag_versions WHERE dag_id = %(dag_id)s AND version = %(version)s;

-- name: job_outputs
SELECT ds.dataset_uuid, ds.producer_output_index AS output_index, ds.backend, ds.dataset_name,
       c.dataset_version, v.location
FROM datasets ds
LEFT JOIN dataset_current c ON c.dataset_uuid = ds.dataset_uuid
LEFT JOIN dataset_versions v ON v.dataset_version = c.dataset_version
WHERE ds.producer_dag_id = %(dag_id)s AND ds.producer_job = %(job)s
ORDER BY ds.producer_output_index;

-- name: job_inputs
-- Each input pinned to the version current now, for the whole life of the task.
SELECT s.input_index, ds.dataset_uuid, ds.dataset_name, ds.backend, c.dataset_version, v.location
FROM dag_subscriptions s
JOIN datasets ds ON ds.dataset_uuid = s.dataset_uuid
LEFT JOIN dataset_current c ON c.dataset_uuid = ds.dataset_uuid
LEFT JOIN dataset_versions v ON v.dataset_version = c.dataset_version
WHERE s.dag_id = %(dag_id)s AND s.dag_version = %(version)s AND s.job = %(job)s
ORDER BY s.input_index;

-- name: subscribers
SELECT DISTINCT s.dag_id, s.dag_version, s.job
FROM dag_subscriptions s
JOIN dags d ON d.dag_id = s.dag_id AND d.active_version = s.dag_version AND NOT d.paused
WHERE s.dataset_uuid = %(dataset_uuid)s AND d.org_id = %(org_id)s
ORDER BY s.dag_id, s.job;

-- name: insert_fire
INSERT INTO trigger_fires (run_id, dag_id, dag_version, trigger, kind, fire_key, config, fired_by)
VALUES (%(run_id)s, %(dag_id)s, %(dag_version)s, %(trigger)s, %(kind)s, %(fire_key)s, %(config)s, %(fired_by)s)
ON CONFLICT (dag_id, trigger, fire_key) DO NOTHING
RETURNING run_id;

-- name: fire_by_key
SELECT run_id FROM trigger_fires
WHERE dag_id = %(dag_id)s AND trigger = %(trigger)s AND fire_key = %(fire_key)s;
