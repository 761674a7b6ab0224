-- Named queries of published names and who may publish them (migration 0026): grants of a
-- name or a prefix to a user or a role, names an admin reclaimed, and which DAG produces a
-- published dataset (what the platform's own readers pin).

-- name: grants_for
-- The grants that let this user (or one of their roles) publish `name`: the name itself, or a
-- prefix `p*` with name starting with p.
SELECT pattern, user_id, role FROM name_grants
WHERE org_id = %(org_id)s
  AND (pattern = %(name)s
       OR (right(pattern, 1) = '*' AND starts_with(%(name)s, left(pattern, -1))))
  AND (user_id = %(user_id)s OR role = ANY(%(roles)s::text[]));

-- name: org_has_grants
SELECT EXISTS (SELECT 1 FROM name_grants WHERE org_id = %(org_id)s) AS any;

-- name: is_reclaimed
SELECT EXISTS (SELECT 1 FROM name_reclaims WHERE org_id = %(org_id)s AND name = %(name)s) AS any;

-- name: reclaimed_from_dag
SELECT name FROM name_reclaims WHERE dag_id = %(dag_id)s;

-- name: insert_grant
INSERT INTO name_grants (org_id, pattern, user_id, role, granted_by)
VALUES (%(org_id)s, %(pattern)s, %(user_id)s, %(role)s, %(granted_by)s)
ON CONFLICT DO NOTHING;

-- name: delete_grant
DELETE FROM name_grants
WHERE org_id = %(org_id)s AND pattern = %(pattern)s
  AND (user_id = %(user_id)s OR role = %(role)s)
RETURNING pattern;

-- name: list_grants
SELECT g.pattern, u.name AS "user", g.role, b.name AS granted_by, g.granted_at
FROM name_grants g
LEFT JOIN users u ON u.user_id = g.user_id
JOIN users b ON b.user_id = g.granted_by
WHERE g.org_id = %(org_id)s
ORDER BY g.pattern, u.name NULLS LAST, g.role;

-- name: list_reclaims
SELECT r.name, d.name AS dag, b.name AS reclaimed_by, r.reclaimed_at
FROM name_reclaims r
JOIN dags d ON d.dag_id = r.dag_id
JOIN users b ON b.user_id = r.reclaimed_by
WHERE r.org_id = %(org_id)s
ORDER BY r.name, d.name;

-- name: unpublish_name
-- Only the name->dataset binding (and the hot window it was) is released: the dataset keeps
-- its uuid, versions and data.
UPDATE datasets SET dataset_name = NULL, hot_window_of = NULL, hot_window_key = NULL
WHERE org_id = %(org_id)s AND dataset_name = %(name)s
RETURNING dataset_uuid, producer_dag_id;

-- name: unlink_hot_windows_of
-- A hot window of a dataset that lost its name serves nothing: a window of whatever publishes
-- the name next is that DAG's to declare.
UPDATE datasets SET hot_window_of = NULL, hot_window_key = NULL
WHERE hot_window_of = %(dataset_uuid)s;

-- name: insert_reclaim
INSERT INTO name_reclaims (org_id, name, dag_id, reclaimed_by)
VALUES (%(org_id)s, %(name)s, %(dag_id)s, %(reclaimed_by)s)
ON CONFLICT (org_id, name, dag_id)
DO UPDATE SET reclaimed_by = EXCLUDED.reclaimed_by, reclaimed_at = now();

-- name: delete_reclaim
-- An admin's (or a grantee's) deploy of that DAG publishes the name again.
DELETE FROM name_reclaims WHERE dag_id = %(dag_id)s AND name = %(name)s;

-- name: producers_of
-- Which DAG produces each dataset (a dataset's producer never changes).
SELECT ds.dataset_uuid, ds.dataset_name, d.name AS producer_dag
FROM datasets ds JOIN dags d ON d.dag_id = ds.producer_dag_id
WHERE ds.dataset_uuid = ANY(%(uuids)s::uuid[]);

-- name: org_admins
SELECT name FROM users WHERE org_id = %(org_id)s AND is_admin ORDER BY name LIMIT 5;
