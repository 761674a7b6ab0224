-- What an attempt reads, resolved when it is fetched (dispatcher/reads.py).

-- name: output_strategies
-- Each output version's own update strategy (a rebuild may change it; the live one keeps its).
SELECT v.dataset_version, coalesce(v.update_strategy, d.update_strategy) AS update_strategy,
       coalesce(v.unique_key, d.unique_key) AS unique_key
FROM dataset_versions v JOIN datasets d USING (dataset_uuid)
WHERE v.dataset_version = ANY(%(versions)s);

-- name: committed_reads
-- The committed pieces an attempt reads: one scope of the versions it reads by scope, every
-- scope of those it reads whole, and the scopes of its append outputs overlapping its range
-- (the own scope excluded: a re-run replaces it), and what its outputs already hold for its
-- own scope (`own`: a re-run can tell whether the chain under a range changed).
SELECT dataset_uuid, dataset_version, scope, range_start, range_end, location,
       chain_id, first_block_hash, last_block_hash, parent_hash
FROM dataset_commits
WHERE location IS NOT NULL
  AND ((dataset_version = ANY(%(scoped)s) AND scope = %(scope)s)
       OR dataset_version = ANY(%(whole)s)
       OR (dataset_version = ANY(%(appends)s) AND scope <> %(scope)s
           AND range_start < %(range_end)s AND range_end > %(range_start)s)
       OR (dataset_version = ANY(%(own)s) AND scope = %(scope)s))
ORDER BY dataset_version, scope;
