-- Query pins: a lease per running query on what it pinned, so the collector deletes a retired
-- location only once no query that may still read it is running.

-- snapshot_xmin: every transaction below it had finished when the pin was taken, so a location
-- retired by one of those was already replaced for this query (it read the new one). Written
-- and committed before the query reads its commits; expires_at bounds a pin its process lost.
CREATE TABLE query_pins (
  query_id       UUID PRIMARY KEY,
  started_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
  expires_at     TIMESTAMPTZ NOT NULL,
  snapshot_xmin  xid8 NOT NULL DEFAULT pg_snapshot_xmin(pg_current_snapshot())
);
CREATE INDEX query_pins_expires_idx ON query_pins (expires_at);

-- The transaction that retired a location, compared with the pins' snapshot_xmin.
ALTER TABLE retired_locations ADD COLUMN retired_xid xid8 NOT NULL DEFAULT pg_current_xact_id();

-- The collector's guard looks up committed locations by prefix (^@).
CREATE INDEX dataset_commits_location_idx ON dataset_commits USING spgist (location);
