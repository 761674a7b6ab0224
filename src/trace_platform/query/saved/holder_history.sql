-- Historic balances of exactly the top N holders at the tip, at every `every`-th block of the
-- synced range (and its last block).
-- param: token =
-- param: n = 5
-- param: every = 100
WITH latest AS (
  SELECT account, arg_max(balance, block_number) AS balance
  FROM token_balances WHERE token_address = lower($token)
  GROUP BY account
),
top AS (SELECT account FROM latest WHERE balance > 0 ORDER BY balance DESC, account LIMIT $n),
history AS (
  SELECT account, block_number, balance FROM token_balances
  WHERE token_address = lower($token) AND account IN (SELECT account FROM top)
),
grid AS (
  SELECT t.account, b.block_number
  FROM top t CROSS JOIN (
    SELECT block_number FROM blocks
    WHERE block_number % $every = 0 OR block_number = (SELECT max(block_number) FROM blocks)
  ) b
)
SELECT g.block_number, g.account, coalesce(h.balance, 0) AS balance
FROM grid g
ASOF LEFT JOIN history h ON g.account = h.account AND g.block_number >= h.block_number
ORDER BY g.account, g.block_number
