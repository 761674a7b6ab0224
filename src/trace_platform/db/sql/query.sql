-- Named queries of the Query Service: registry resolution, read inside one snapshot.

-- name: pin_datasets
-- The named datasets plus their published hot windows, each with its current version and that
-- version's committed locations: one statement, so one snapshot for every pin.
SELECT ds.dataset_uuid, ds.dataset_name, coalesce(v.backend, ds.backend) AS backend,
       ds.read_roles, ds.org_id,
       ds.hot_window_of, ds.hot_window_key,
       d.owner_user_id, d.deploy_roles,
       c.dataset_version, v.location AS version_location,
       CASE WHEN coalesce(v.backend, ds.backend) = 'postgres'
            THEN to_regclass(v.location) IS NOT NULL END AS table_exists,
       ARRAY(SELECT dc.location FROM dataset_commits dc
             WHERE dc.dataset_version = c.dataset_version AND dc.location IS NOT NULL
             ORDER BY dc.scope) AS commit_locations
FROM datasets ds
JOIN dags d ON d.dag_id = ds.producer_dag_id
LEFT JOIN dataset_current c ON c.dataset_uuid = ds.dataset_uuid
LEFT JOIN dataset_versions v ON v.dataset_version = c.dataset_version
WHERE ds.org_id = %(org_id)s AND ds.dataset_name IS NOT NULL
  AND (ds.dataset_name = ANY(%(names)s)
       OR ds.hot_window_of IN (SELECT x.dataset_uuid FROM datasets x
                               WHERE x.org_id = %(org_id)s AND x.dataset_name = ANY(%(names)s)));

-- name: readable_names
SELECT ds.dataset_name, ds.read_roles, ds.org_id, d.owner_user_id, d.deploy_roles
FROM datasets ds JOIN dags d ON d.dag_id = ds.producer_dag_id
WHERE ds.org_id = %(org_id)s AND ds.dataset_name IS NOT NULL
ORDER BY ds.dataset_name;

-- name: insert_pin
-- A query's lease on what it pins (see migration 0013): committed before it reads any commit.
INSERT INTO query_pins (query_id, expires_at)
VALUES (%(query_id)s, now() + make_interval(secs => %(ttl)s));

-- name: delete_pin
DELETE FROM query_pins WHERE query_id = %(query_id)s;
