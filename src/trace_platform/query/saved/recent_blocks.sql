-- The newest blocks (hot window, Postgres) joined with their transactions (cold history,
-- Parquet): a federated hot + cold join.
-- param: n = 10
SELECT h.block_number, h.gas_used, count(t.block_number) AS transactions,
       count(DISTINCT t.from_address) AS senders
FROM blocks_hot h
LEFT JOIN transactions t ON t.block_number = h.block_number
GROUP BY h.block_number, h.gas_used
ORDER BY h.block_number DESC
LIMIT $n
