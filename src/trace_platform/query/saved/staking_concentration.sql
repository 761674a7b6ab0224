-- Staking concentration per period (epoch, or block window): validators with stake, total
-- stake, HHI (sum of squared shares), Nakamoto coefficient (fewest validators holding more than
-- 1/3) and top share.
SELECT window_end, epoch, validators, total_stake, round(hhi, 4) AS hhi, nakamoto_coefficient,
       round(top_share, 4) AS top_share
FROM staking_concentration
ORDER BY window_end
