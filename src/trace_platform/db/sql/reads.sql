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
-- Each version's rows by key (a LATERAL subquery per version, the scoped ones with LIMIT 1),
-- not one scan filtered by an OR of the four: its generic plan cannot tell which arrays are
-- empty, and with a few versions holding many scopes it read every commit of every version
-- through the (dataset_version, scope) index (120,000 rows, 110 ms, for a claim reading one).
-- An append version's overlapping scopes are found by range (dataset_commits_range_idx, a
-- GiST index of each commit's range beside its version's hash; the inner subquery, fenced by
-- OFFSET 0, can use no other index), the exact conditions then checked on each row: through
-- the version's key alone it read every commit of the version (20,000 for 20,000 ranges).
SELECT c.*
FROM (
  SELECT k.*
  FROM unnest(%(scoped)s::uuid[] || %(own)s::uuid[]) AS v(version)
  CROSS JOIN LATERAL (
    SELECT d.dataset_uuid, d.dataset_version, d.scope, d.range_start, d.range_end, d.location,
           d.chain_id, d.first_block_hash, d.last_block_hash, d.parent_hash
    FROM dataset_commits d
    WHERE d.dataset_version = v.version AND d.scope = %(scope)s
    LIMIT 1
  ) k
  UNION
  SELECT k.*
  FROM unnest(%(whole)s::uuid[]) AS v(version)
  CROSS JOIN LATERAL (
    SELECT d.dataset_uuid, d.dataset_version, d.scope, d.range_start, d.range_end, d.location,
           d.chain_id, d.first_block_hash, d.last_block_hash, d.parent_hash
    FROM dataset_commits d
    WHERE d.dataset_version = v.version
    OFFSET 0
  ) k
  UNION
  SELECT k.*
  FROM unnest(%(appends)s::uuid[]) AS v(version)
  CROSS JOIN LATERAL (
    SELECT d.dataset_uuid, d.dataset_version, d.scope, d.range_start, d.range_end, d.location,
           d.chain_id, d.first_block_hash, d.last_block_hash, d.parent_hash
    FROM (
      SELECT o.* FROM dataset_commits o
      WHERE trace_commit_span(o.dataset_version, o.range_start, o.range_end)
            && trace_commit_span(v.version, %(range_start)s, %(range_end)s)
        AND o.range_start IS NOT NULL AND o.range_end IS NOT NULL
      OFFSET 0
    ) d
    WHERE d.dataset_version = v.version AND d.scope <> %(scope)s
      AND d.range_start < %(range_end)s AND d.range_end > %(range_start)s
  ) k
) c
WHERE c.location IS NOT NULL
ORDER BY c.dataset_version, c.scope;
