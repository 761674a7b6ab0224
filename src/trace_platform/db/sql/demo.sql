-- Named queries of the demo (`trace demo`).

-- name: current_coverage
-- Per named dataset, what its current version holds: range commits, their span, rows.
SELECT ds.dataset_name, min(c.range_start) AS lo, max(c.range_end) AS hi,
       count(c.*) AS commits, coalesce(sum(c.row_count), 0) AS row_count
FROM datasets ds
JOIN dataset_current cur USING (dataset_uuid)
LEFT JOIN dataset_commits c ON c.dataset_version = cur.dataset_version
WHERE ds.dataset_name = ANY(%(names)s)
GROUP BY ds.dataset_name;

-- name: unfinished_tasks
SELECT count(*) AS n
FROM task_status s JOIN task_registry r USING (task_id, start_day)
WHERE r.dag_id = (SELECT dag_id FROM dags WHERE name = %(dag)s)
  AND s.status NOT IN ('succeeded', 'failed', 'canceled');

-- name: rows_now
-- Query Service SQL (DuckDB, not the state store): what a published dataset holds now.
-- {dataset} is formatted in as a table name (a published dataset name); the Query Service's
-- guard accepts it only as such.
SELECT count(*) FROM {dataset}

-- name: raw_identities
-- The ranges the raw datasets' current versions hold, with the chain each was read from.
SELECT DISTINCT c.range_start, c.range_end, c.chain_id, c.first_block_hash, c.parent_hash,
       c.last_block_hash
FROM datasets ds
JOIN dataset_current cur USING (dataset_uuid)
JOIN dataset_commits c ON c.dataset_version = cur.dataset_version
WHERE ds.dataset_name = ANY(%(names)s) AND c.range_start IS NOT NULL
ORDER BY c.range_start;
