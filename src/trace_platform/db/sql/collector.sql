-- The collector of retired locations (registry/collector.py).

-- name: expire_pins
-- Pins whose query can no longer be running (its process died before it released them).
DELETE FROM query_pins WHERE expires_at <= now();

-- name: collectable
-- Retired locations nothing can reach any more, locked for this run: retired at least `grace`
-- ago, before the snapshot of every live query pin (a query pinned earlier may be reading
-- them), and never a location any commit still references: neither the location itself, nor
-- one under it, nor one above it (a Parquet location is a '/'-ended prefix; a table is a name).
SELECT r.id, r.org_id, r.backend, r.location
FROM retired_locations r
WHERE r.deleted_at IS NULL AND r.refused IS NULL
  AND r.retired_at <= now() - make_interval(secs => %(grace)s)
  AND NOT EXISTS (SELECT 1 FROM query_pins p
                  WHERE p.expires_at > now() AND p.snapshot_xmin <= r.retired_xid)
  AND (r.backend = 'postgres' OR right(r.location, 1) = '/')
  AND NOT EXISTS (SELECT 1 FROM dataset_commits dc
                  WHERE r.backend = 'postgres' AND dc.location = r.location)
  AND NOT EXISTS (SELECT 1 FROM dataset_commits dc
                  WHERE r.backend = 'parquet' AND dc.location ^@ r.location)
  AND NOT EXISTS (SELECT 1 FROM dataset_commits dc
                  WHERE r.backend = 'parquet'
                    AND dc.location = ANY (ARRAY(
                      SELECT left(r.location, i) FROM generate_series(1, length(r.location) - 1) i
                      WHERE substr(r.location, i, 1) = '/')))
ORDER BY r.id
LIMIT %(batch)s
FOR UPDATE OF r SKIP LOCKED;

-- name: mark_deleted
UPDATE retired_locations SET deleted_at = now() WHERE id = ANY(%(ids)s);

-- name: mark_refused
-- Not the platform's to delete: left where it is, and never offered again.
UPDATE retired_locations SET refused = %(reason)s WHERE id = %(id)s;

-- name: collectable_batches
-- Settled buffer batches whose artifact may go, locked for this run: loaded at least `grace`
-- ago, or dead at least `dead_retention` ago; never one whose artifact another record still
-- needs (an attempt may publish one file to two datasets: both must be settled so).
SELECT r.record_id, r.org_id, r.task_id, r.attempt, r.location
FROM buffer_records r
WHERE r.collectable_at IS NOT NULL AND r.artifact_deleted_at IS NULL
  AND r.artifact_refused IS NULL
  AND r.collectable_at <= now() - make_interval(secs => CASE r.status
        WHEN 'loaded' THEN %(grace)s WHEN 'dead' THEN %(dead_retention)s END)
  AND NOT EXISTS (
    SELECT 1 FROM buffer_records o
    WHERE o.task_id = r.task_id AND o.location = r.location AND o.record_id <> r.record_id
      AND o.artifact_deleted_at IS NULL
      AND (o.collectable_at IS NULL
           OR o.collectable_at > now() - make_interval(secs => CASE o.status
                WHEN 'loaded' THEN %(grace)s WHEN 'dead' THEN %(dead_retention)s END)))
ORDER BY r.collectable_at
LIMIT %(batch)s
FOR UPDATE OF r SKIP LOCKED;

-- name: mark_batches_collected
UPDATE buffer_records SET artifact_deleted_at = now() WHERE record_id = ANY(%(ids)s);

-- name: mark_batch_refused
-- Not a key the platform let the attempt write: left where it is, never offered again.
UPDATE buffer_records SET artifact_refused = %(reason)s WHERE record_id = %(record_id)s;
