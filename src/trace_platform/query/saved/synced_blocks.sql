-- The span of the synced blocks (hot window and cold history): the first and the last.
SELECT min(block_number) AS lo, max(block_number) AS hi FROM blocks
