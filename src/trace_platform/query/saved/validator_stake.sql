-- Stake, share and rank of every validator at the end of one period (an epoch when the chain
-- has epochs, else a block window; default: the last).
-- param: window_end = -1
SELECT window_end, epoch, validator_id, stake, round(share, 4) AS share, stake_rank
FROM validator_stake
WHERE window_end = CASE WHEN $window_end < 0 THEN (SELECT max(window_end) FROM validator_stake)
                        ELSE $window_end END
ORDER BY stake_rank, validator_id
