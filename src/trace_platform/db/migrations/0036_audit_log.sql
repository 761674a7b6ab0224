-- The audit log (issue 42): one append-only row per user or admin action, written in the
-- action's own transaction (trace_platform/audit.py). Partitioned as the task registry is:
-- by start_day (days since 2025-01-01, of `at` in UTC), one partition a month named
-- audit_log_YYYY_MM, made ahead by trace_ensure_partitions; retention exports and drops whole
-- months. Never updated; never holds a secret's value or an API key (audit.py refuses them).
CREATE TABLE audit_log (
  id            BIGSERIAL,
  start_day     SMALLINT NOT NULL,
  at            TIMESTAMPTZ NOT NULL DEFAULT now(),
  org_id        UUID NOT NULL,
  -- who: a user (by id and name, and the API key they used when known), or the platform
  -- itself acting on its own schedule.
  actor_kind    TEXT NOT NULL
                CHECK (actor_kind IN ('user', 'system', 'scheduler', 'eventbridge')),
  actor_user_id UUID,
  actor_name    TEXT NOT NULL CHECK (length(actor_name) BETWEEN 1 AND 200),
  actor_key_id  UUID,
  -- what: the action's name is from audit.py's closed vocabulary (noun.verb)
  action        TEXT NOT NULL CHECK (action ~ '^[a-z]+\.[a-z_]+$' AND length(action) <= 64),
  target_kind   TEXT NOT NULL CHECK (target_kind ~ '^[a-z]+$' AND length(target_kind) <= 32),
  target        TEXT NOT NULL CHECK (length(target) <= 300),
  dag           TEXT CHECK (length(dag) <= 128),   -- the DAG it concerns, for --dag
  outcome       TEXT NOT NULL DEFAULT 'ok' CHECK (outcome IN ('ok', 'dry_run', 'noop')),
  source        TEXT NOT NULL
                CHECK (source IN ('cli', 'http', 'webhook', 'eventbridge', 'scheduler', 'system')),
  request_id    TEXT CHECK (length(request_id) <= 128),
  details       JSONB NOT NULL DEFAULT '{}'
                CHECK (jsonb_typeof(details) = 'object' AND octet_length(details::text) <= 16384),
  CHECK (start_day = trace_start_day(at)),
  CHECK ((actor_kind = 'user') = (actor_user_id IS NOT NULL)),
  PRIMARY KEY (start_day, id)
) PARTITION BY RANGE (start_day);

-- Every read is one org's rows, newest first, bounded by time (audit.sql list).
CREATE INDEX audit_log_org_at_idx ON audit_log (org_id, at DESC, id DESC);

-- Partition upkeep: every table range-partitioned by start_day, found in the catalog, so this
-- table (and any later one) is kept ahead without another edit of this function. The same
-- months and names as 0002's version.
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
      IF to_regclass(part) IS NULL THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%s) TO (%s)',
                       part, parent, lo, hi);
        created := created + 1;
      END IF;
    END LOOP;
  END LOOP;
  RETURN created;
END
$$;

SELECT trace_ensure_partitions();
