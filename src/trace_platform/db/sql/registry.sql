-- Named queries of DAG deploys and the dataset registry.

-- name: insert_dag
INSERT INTO dags (dag_id, org_id, name, owner_user_id)
VALUES (%(dag_id)s, %(org_id)s, %(name)s, %(owner)s)
ON CONFLICT (org_id, name) DO NOTHING;

-- name: take_dag_ownership
-- An admin's deploy of the platform's DAG makes it the admin's (registry/reserved.py).
UPDATE dags SET owner_user_id = %(owner)s, deploy_roles = '{}' WHERE dag_id = %(dag_id)s;

-- name: dag_for_update
SELECT * FROM dags WHERE org_id = %(org_id)s AND name = %(name)s FOR UPDATE;

-- name: dag_by_name
SELECT * FROM dags WHERE org_id = %(org_id)s AND name = %(name)s;

-- name: dag_by_id
SELECT * FROM dags WHERE dag_id = %(dag_id)s;

-- name: dag_version
SELECT * FROM dag_versions WHERE dag_id = %(dag_id)s AND version = %(version)s;

-- name: next_version
SELECT coalesce(max(version), 0) + 1 AS v FROM dag_versions WHERE dag_id = %(dag_id)s;

-- name: insert_dag_version
INSERT INTO dag_versions (dag_id, version, spec, source_yaml, checksum, deployed_by)
VALUES (%(dag_id)s, %(version)s, %(spec)s, %(source_yaml)s, %(checksum)s, %(deployed_by)s);

-- name: list_dags
SELECT d.dag_id, d.name, d.active_version, d.paused, d.deploy_roles, d.owner_user_id, d.org_id,
       v.deployed_at, u.name AS owner
FROM dags d
LEFT JOIN dag_versions v ON v.dag_id = d.dag_id AND v.version = d.active_version
JOIN users u ON u.user_id = d.owner_user_id
WHERE d.org_id = %(org_id)s
ORDER BY d.name;

-- name: set_deploy_roles
UPDATE dags SET deploy_roles = %(roles)s WHERE dag_id = %(dag_id)s;

-- name: dataset_by_producer
SELECT * FROM datasets
WHERE producer_dag_id = %(dag_id)s AND producer_job = %(job)s AND producer_output_index = %(idx)s;

-- name: datasets_of_dag
SELECT * FROM datasets WHERE producer_dag_id = %(dag_id)s;

-- name: dataset_by_name
SELECT ds.*, c.dataset_version AS current_version, v.location AS version_location
FROM datasets ds
LEFT JOIN dataset_current c USING (dataset_uuid)
LEFT JOIN dataset_versions v ON v.dataset_version = c.dataset_version
WHERE ds.org_id = %(org_id)s AND ds.dataset_name = %(name)s;

-- name: insert_dataset
INSERT INTO datasets (dataset_uuid, org_id, backend, location, update_strategy, unique_key,
                      producer_dag_id, producer_job, producer_output_index)
VALUES (%(dataset_uuid)s, %(org_id)s, %(backend)s, %(location)s, %(update_strategy)s,
        %(unique_key)s, %(dag_id)s, %(job)s, %(idx)s);

-- name: update_dataset_shape
UPDATE datasets SET backend = %(backend)s, location = %(location)s,
       update_strategy = %(update_strategy)s, unique_key = %(unique_key)s
WHERE dataset_uuid = %(dataset_uuid)s;

-- name: unpublish_dag
-- A buffered dataset keeps its name: it is no job's output (migration 0028).
UPDATE datasets SET dataset_name = NULL, hot_window_of = NULL, hot_window_key = NULL
WHERE producer_dag_id = %(dag_id)s AND producer_job NOT LIKE 'buffered:%%';

-- name: set_hot_window
UPDATE datasets SET hot_window_of = %(of)s, hot_window_key = %(key)s
WHERE dataset_uuid = %(dataset_uuid)s;

-- name: publish
UPDATE datasets SET dataset_name = %(name)s WHERE dataset_uuid = %(dataset_uuid)s;

-- name: insert_dataset_version
INSERT INTO dataset_versions (dataset_version, dataset_uuid, dag_id, dag_version, location)
VALUES (%(dataset_version)s, %(dataset_uuid)s, %(dag_id)s, %(dag_version)s, %(location)s);

-- name: insert_subscription
INSERT INTO dag_subscriptions (dag_id, dag_version, job, input_index, dataset_uuid, triggers)
VALUES (%(dag_id)s, %(dag_version)s, %(job)s, %(input_index)s, %(dataset_uuid)s, %(triggers)s);

-- name: upsert_slot
INSERT INTO pool_slots (dag_id, pool, slot_index, env, secrets)
VALUES (%(dag_id)s, %(pool)s, %(slot_index)s, %(env)s, %(secrets)s)
ON CONFLICT (dag_id, pool, slot_index)
DO UPDATE SET env = EXCLUDED.env, secrets = EXCLUDED.secrets, retired = false;

-- name: retire_slots
-- Slots the new version no longer has: held leases stay until released, no new ones.
UPDATE pool_slots SET retired = true
WHERE dag_id = %(dag_id)s AND NOT ((pool, slot_index) IN (SELECT * FROM unnest(%(pools)s::text[], %(idx)s::int[])));

-- name: init_cron
INSERT INTO cron_state (dag_id, trigger, last_fire_at)
VALUES (%(dag_id)s, %(trigger)s, now())
ON CONFLICT DO NOTHING;

-- name: list_datasets
SELECT ds.dataset_uuid, ds.dataset_name, ds.backend, ds.location, ds.update_strategy, ds.read_roles,
       ds.producer_job, ds.producer_output_index, ds.org_id,
       d.name AS producer_dag, d.dag_id AS producer_dag_id, d.owner_user_id, d.deploy_roles,
       c.dataset_version AS current_version,
       (SELECT count(*) FROM dataset_commits dc WHERE dc.dataset_version = c.dataset_version) AS commits,
       (SELECT sum(row_count) FROM dataset_commits dc WHERE dc.dataset_version = c.dataset_version) AS row_count,
       (SELECT sum(byte_count) FROM dataset_commits dc WHERE dc.dataset_version = c.dataset_version) AS byte_count
FROM datasets ds
JOIN dags d ON d.dag_id = ds.producer_dag_id
LEFT JOIN dataset_current c ON c.dataset_uuid = ds.dataset_uuid
WHERE ds.org_id = %(org_id)s AND ds.dataset_name IS NOT NULL
ORDER BY ds.dataset_name;

-- name: set_read_roles
UPDATE datasets SET read_roles = %(roles)s WHERE dataset_uuid = %(dataset_uuid)s;

-- Dataset versions: listed, and purged by an admin (never automatically).

-- name: pinned_versions
-- Versions of the dataset an unfinished task reads or writes: a purge keeps them (the task
-- would find its files gone, or commit to a version that no longer exists).
SELECT DISTINCT (x ->> 'dataset_version')::uuid AS dataset_version
FROM task_status s
JOIN task_registry r ON r.task_id = s.task_id AND r.start_day = s.start_day
CROSS JOIN LATERAL jsonb_array_elements(r.input_versions || r.outputs) AS x
WHERE s.status IN ('queued', 'buffered', 'running')
  AND x ->> 'dataset_uuid' = %(dataset_uuid)s::text
  AND x ->> 'dataset_version' IS NOT NULL;

-- name: versions_of_dataset
-- Every version of a dataset, newest first, with what still needs it: the served pointer, the
-- active and building DAG versions' maps, and the other DAG versions a rollback could go back to.
SELECT v.dataset_version, v.state, v.dag_version, v.created_at, v.location,
       (c.dataset_version IS NOT NULL) AS current,
       k.commits, k.row_count, k.byte_count,
       coalesce(d.active_version = ANY(m.mapped_by), false) AS active_map,
       coalesce(d.building_version = ANY(m.mapped_by), false) AS building_map,
       m.rollback_versions
FROM dataset_versions v
JOIN datasets ds ON ds.dataset_uuid = v.dataset_uuid
JOIN dags d ON d.dag_id = ds.producer_dag_id
LEFT JOIN dataset_current c ON c.dataset_version = v.dataset_version
CROSS JOIN LATERAL (
  SELECT count(*) AS commits, sum(row_count) AS row_count, sum(byte_count) AS byte_count
  FROM dataset_commits dc WHERE dc.dataset_version = v.dataset_version
) k
CROSS JOIN LATERAL (
  SELECT coalesce(array_agg(o.dag_version ORDER BY o.dag_version), '{}') AS mapped_by,
         coalesce(array_agg(o.dag_version ORDER BY o.dag_version) FILTER (
           WHERE dv.state <> 'abandoned'
             AND o.dag_version IS DISTINCT FROM d.active_version
             AND o.dag_version IS DISTINCT FROM d.building_version), '{}') AS rollback_versions
  FROM dag_version_outputs o
  JOIN dag_versions dv ON dv.dag_id = o.dag_id AND dv.version = o.dag_version
  WHERE o.dataset_version = v.dataset_version
) m
WHERE v.dataset_uuid = %(dataset_uuid)s
ORDER BY v.created_at DESC, v.dataset_version DESC;

-- name: purge_locations
-- What purged versions point at, each with the backend its version was built with (a Postgres
-- version lives in "schema.table", a Parquet one under an object-store prefix; the dataset's
-- backend may have changed since). A location some surviving commit still names is not retired.
SELECT DISTINCT l.backend, l.location
FROM (
  SELECT CASE WHEN strpos(v.location, '/') = 0 THEN 'postgres' ELSE 'parquet' END AS backend,
         dc.location
  FROM dataset_commits dc JOIN dataset_versions v USING (dataset_version)
  WHERE dc.dataset_version = ANY(%(versions)s) AND dc.location IS NOT NULL
  UNION
  SELECT 'postgres', v.location FROM dataset_versions v
  WHERE v.dataset_version = ANY(%(versions)s) AND strpos(v.location, '/') = 0
) l
WHERE NOT EXISTS (
  SELECT 1 FROM dataset_commits s
  WHERE s.location = l.location AND NOT s.dataset_version = ANY(%(versions)s)
)
ORDER BY l.location;

-- name: purge_retire
-- The collector deletes them once no query pinned before now can still be reading them.
INSERT INTO retired_locations (org_id, backend, location, reason)
SELECT %(org_id)s, t.backend, t.location, 'purged'
FROM unnest(%(backends)s::text[], %(locations)s::text[]) AS t(backend, location);

-- name: purge_commits
DELETE FROM dataset_commits WHERE dataset_version = ANY(%(versions)s);

-- name: purge_outputs
DELETE FROM dag_version_outputs WHERE dataset_version = ANY(%(versions)s);

-- name: purge_versions
DELETE FROM dataset_versions WHERE dataset_version = ANY(%(versions)s);
