-- An append output's committed scopes overlapping an attempt's range (committed_reads) were
-- found among every commit of the version, each filtered by its range: 20,000 rows for a
-- version of 20,000 ranges, at every claim of every range. A B-tree cannot answer "overlaps"
-- without reading everything on one side of the range; a GiST index of ranges can, but not
-- beside a uuid without the btree_gist extension (which this schema does not require). So a
-- commit's range is indexed as a segment of a plane, at its version's hash on one axis and
-- from range_start to range_end on the other: a version's overlapping ranges are the segments
-- its query's segment touches. The box is a superset (another version of the same hash, float
-- rounding of a bigint, ranges that only touch): readers check the exact conditions on the row.
CREATE FUNCTION trace_commit_span(dataset_version uuid, range_start bigint, range_end bigint)
RETURNS box
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT box(point(uuid_hash(dataset_version), range_start),
             point(uuid_hash(dataset_version), range_end))
$$;

-- Range commits only (a partition's or a whole dataset's commit has no range).
CREATE INDEX dataset_commits_range_idx ON dataset_commits
  USING gist (trace_commit_span(dataset_version, range_start, range_end))
  WHERE range_start IS NOT NULL AND range_end IS NOT NULL;
