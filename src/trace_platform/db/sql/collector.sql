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
