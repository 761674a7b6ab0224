-- name: analytics_blocks
-- Query Service SQL (DuckDB, not the state store): the synced blocks' span, to space the
-- analytics page's points (blocks is the platform DAG's, hot window and cold history).
SELECT min(block_number) AS lo, max(block_number) AS hi FROM blocks
