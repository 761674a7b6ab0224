-- Named queries of the Query Service: registry resolution, read inside one snapshot.

-- name: datasets_by_name
-- The named datasets plus their published hot windows, with each one's current version.
SELECT ds.dataset_uuid, ds.dataset_name, ds.backend, ds.read_roles, ds.org_id,
       ds.hot_window_of, ds.hot_window_key,
       d.owner_user_id, d.deploy_roles,
       c.dataset_version, v.location AS version_location,
       CASE WHEN ds.backend = 'postgres' THEN to_regclass(v.location) IS NOT NULL END AS table_exists
FROM datasets ds
JOIN dags d ON d.dag_id = ds.producer_dag_id
LEFT JOIN dataset_current c ON c.dataset_uuid = ds.dataset_uuid
LEFT JOIN dataset_versions v ON v.dataset_version = c.dataset_version
WHERE ds.org_id = %(org_id)s AND ds.dataset_name IS NOT NULL
  AND (ds.dataset_name = ANY(%(names)s)
       OR ds.hot_window_of IN (SELECT x.dataset_uuid FROM datasets x
                               WHERE x.org_id = %(org_id)s AND x.dataset_name = ANY(%(names)s)));

-- name: commit_locations
SELECT dataset_version, location FROM dataset_commits
WHERE dataset_version = ANY(%(versions)s) AND location IS NOT NULL
ORDER BY dataset_version, scope;

-- name: readable_names
SELECT ds.dataset_name, ds.read_roles, ds.org_id, d.owner_user_id, d.deploy_roles
FROM datasets ds JOIN dags d ON d.dag_id = ds.producer_dag_id
WHERE ds.org_id = %(org_id)s AND ds.dataset_name IS NOT NULL
ORDER BY ds.dataset_name;
