-- Every token's total supply at the tip of the synced range and its largest supply ever, in
-- exact base units (any uint256: the large-amount devnet token reaches 2^256-1).
SELECT token_address, arg_max(total_supply, block_number) AS supply_at_tip,
       max(total_supply) AS largest_supply, count(*) AS supply_changes
FROM token_supply
GROUP BY token_address
ORDER BY supply_at_tip DESC, token_address
