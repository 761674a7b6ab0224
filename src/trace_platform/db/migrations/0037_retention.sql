-- Retention by partition (trace admin retention, src/trace_platform/retention): each monthly
-- partition of the start_day-partitioned history (task_registry, task_attempts, events, and any
-- later table partitioned the same way), and the task_status rows of that month (hash-partitioned:
-- no month to drop), exported to Parquet in the object store, read back, recorded here, and
-- only then detached and dropped.

-- One row per exported unit: a partition (`relname` its table's name) or a month of task_status
-- rows (`task_status_YYYY_MM`). Written once its files read back with `row_count` rows whose
-- key checksum is `key_checksum`; the drop checks the table against both first.
CREATE TABLE retention_exports (
  relname       TEXT PRIMARY KEY,
  parent        TEXT NOT NULL,
  lo_day        SMALLINT NOT NULL,          -- [lo_day, hi_day): the start_days it held
  hi_day        SMALLINT NOT NULL CHECK (hi_day > lo_day),
  export_id     UUID NOT NULL,              -- the attempt whose files these are (its own prefix)
  prefix        TEXT NOT NULL,              -- object-store prefix of those files
  row_count     BIGINT NOT NULL CHECK (row_count >= 0),
  key_checksum  NUMERIC NOT NULL,           -- sum of md5(primary key text)'s first 60 bits
  exported_at   TIMESTAMPTZ NOT NULL,         -- the snapshot the export read
  dropped_at    TIMESTAMPTZ                 -- the rows left Postgres (partition dropped, rows deleted)
);

CREATE INDEX retention_exports_range_idx ON retention_exports (parent, lo_day, hi_day);

-- The files of an export, one per org its rows belong to (NULL: rows of no org), so the history
-- datasets (retention/history.py) give each org's admins their own org's rows and nobody else's.
CREATE TABLE retention_export_files (
  relname    TEXT NOT NULL REFERENCES retention_exports (relname) ON DELETE CASCADE,
  key        TEXT NOT NULL,
  org_id     UUID,
  row_count  BIGINT NOT NULL CHECK (row_count >= 0),
  bytes      BIGINT NOT NULL,
  sha256     TEXT NOT NULL,
  PRIMARY KEY (relname, key)
);

CREATE INDEX retention_export_files_org_idx ON retention_export_files (org_id);

-- Partitions ahead as 0036's version makes them (every table range-partitioned by start_day),
-- but never one retention exported: a dropped month made again would hold nothing and look like
-- history that was never exported.
CREATE OR REPLACE FUNCTION trace_ensure_partitions(months_ahead int DEFAULT 2, months_back int DEFAULT 1)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  parent text;
  m date;
  lo smallint;
  hi smallint;
  created int := 0;
  part text;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('trace_ensure_partitions'));
  FOR parent IN
    SELECT c.relname
    FROM pg_partitioned_table p
    JOIN pg_class c ON c.oid = p.partrelid
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = p.partattrs[0]
    WHERE p.partstrat = 'r' AND p.partnatts = 1 AND a.attname = 'start_day'
      AND c.relnamespace = current_schema()::regnamespace AND NOT c.relispartition
    ORDER BY c.relname
  LOOP
    FOR i IN -months_back..months_ahead LOOP
      m := (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i))::date;
      lo := (m - DATE '2025-01-01')::smallint;
      hi := ((m + interval '1 month')::date - DATE '2025-01-01')::smallint;
      part := format('%s_%s', parent, to_char(m, 'YYYY_MM'));
      IF to_regclass(part) IS NULL
         AND NOT EXISTS (SELECT 1 FROM retention_exports x WHERE x.relname = part) THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%s) TO (%s)',
                       part, parent, lo, hi);
        created := created + 1;
      END IF;
    END LOOP;
  END LOOP;
  RETURN created;
END
$$;
