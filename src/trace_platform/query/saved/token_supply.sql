-- Total supply of a token at every block of the synced range (or every `every`-th block):
-- cumulative mints minus burns from dataset token_supply (Spark), carried forward over the
-- blocks dataset (hot window + cold history).
-- param: token =
-- param: every = 1
SELECT b.block_number, coalesce(s.total_supply, 0) AS total_supply
FROM (
  SELECT block_number FROM blocks
  WHERE block_number % $every = 0 OR block_number = (SELECT max(block_number) FROM blocks)
) b
ASOF LEFT JOIN (
  SELECT block_number, total_supply FROM token_supply WHERE token_address = lower($token)
) s ON b.block_number >= s.block_number
ORDER BY b.block_number
