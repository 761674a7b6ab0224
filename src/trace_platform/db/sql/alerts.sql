-- The platform's org-wide alert datasets (migration 0029): registered at deploy by the first
-- DAG that runs alert_evaluate / alert_route, their writers kept by every DAG's deploys.

-- name: mark_platform
UPDATE buffered_datasets SET platform = %(platform)s WHERE dataset_uuid = %(dataset_uuid)s;

-- name: set_dag_writers
-- The DAG's own writers ('dag.*') replaced by `writers`; every other DAG's kept.
UPDATE buffered_datasets
SET writers = ARRAY(
  SELECT DISTINCT w FROM unnest(
    ARRAY(SELECT x FROM unnest(writers) AS x WHERE split_part(x, '.', 1) <> %(dag)s)
    || %(writers)s::text[]) AS w
  ORDER BY w)
WHERE dataset_uuid = %(dataset_uuid)s;
