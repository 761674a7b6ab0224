-- What an attempt reads, resolved when it is fetched (dispatcher/reads.py).

-- name: output_strategies
SELECT dataset_uuid, update_strategy, unique_key
FROM datasets
WHERE dataset_uuid = ANY(%(uuids)s);

-- name: committed_reads
-- The committed pieces an attempt reads: one scope of the versions it reads by scope, every
-- scope of those it reads whole, and the scopes of its append outputs overlapping its range
-- (the own scope excluded: a re-run replaces it).
SELECT dataset_uuid, dataset_version, scope, range_start, range_end, location
FROM dataset_commits
WHERE location IS NOT NULL
  AND ((dataset_version = ANY(%(scoped)s) AND scope = %(scope)s)
       OR dataset_version = ANY(%(whole)s)
       OR (dataset_version = ANY(%(appends)s) AND scope <> %(scope)s
           AND range_start < %(range_end)s AND range_end > %(range_start)s))
ORDER BY dataset_version, scope;
