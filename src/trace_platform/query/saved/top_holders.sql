-- The top N holders of a token at the tip of the synced range, with each one's share of supply.
-- param: token =
-- param: n = 10
WITH latest AS (
  SELECT account, arg_max(balance, block_number) AS balance, max(block_number) AS last_change
  FROM token_balances WHERE token_address = lower($token)
  GROUP BY account
)
SELECT rank() OVER (ORDER BY balance DESC) AS rank, account, balance,
       round(CAST(balance AS DOUBLE) / sum(CAST(balance AS DOUBLE)) OVER (), 4) AS share,
       last_change
FROM latest WHERE balance > 0
ORDER BY balance DESC, account
LIMIT $n
