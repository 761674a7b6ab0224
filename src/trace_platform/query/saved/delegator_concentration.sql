-- Delegator concentration per validator at the end of one period (default: the last): number
-- of delegators with stake, total stake, the largest delegator and its share, HHI across them.
-- param: window_end = -1
SELECT window_end, epoch, validator_id, delegators, total_stake, top_delegator,
       round(top_delegator_share, 4) AS top_delegator_share, round(hhi, 4) AS hhi
FROM delegator_concentration
WHERE window_end = CASE WHEN $window_end < 0
                        THEN (SELECT max(window_end) FROM delegator_concentration)
                        ELSE $window_end END
ORDER BY validator_id
