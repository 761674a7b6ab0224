-- Orchestration state. Task records are split as in the tracking/CQRS note: an immutable,
-- range-partitioned registry (never updated, no dead tuples) and one small mutable status row.

-- start_day: days since 2025-01-01; the partition key and the hint carried by wake-ups.
CREATE FUNCTION trace_start_day(ts timestamptz) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT ((ts AT TIME ZONE 'UTC')::date - DATE '2025-01-01')::smallint
$$;

-- The task definition: written once at creation, never updated.
CREATE TABLE task_registry (
  task_id          UUID NOT NULL,
  start_day        SMALLINT NOT NULL,
  org_id           UUID NOT NULL,
  dag_id           UUID,
  dag_version      INT,
  job              TEXT NOT NULL,
  operator         TEXT NOT NULL,
  runtime          TEXT NOT NULL,
  config           JSONB NOT NULL DEFAULT '{}',
  parent_task_id   UUID,
  input_event_id   UUID,
  input_event      JSONB,
  input_versions   JSONB NOT NULL DEFAULT '[]',
  timeout_seconds  INT NOT NULL CHECK (timeout_seconds > 0),
  max_attempts     INT NOT NULL CHECK (max_attempts > 0),
  retry_backoff_seconds     DOUBLE PRECISION NOT NULL,
  retry_backoff_max_seconds DOUBLE PRECISION NOT NULL,
  created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (start_day, task_id)
) PARTITION BY RANGE (start_day);

CREATE INDEX task_registry_parent_idx ON task_registry (parent_task_id) WHERE parent_task_id IS NOT NULL;
CREATE INDEX task_registry_created_idx ON task_registry (created_at);

-- The only mutable task row: tiny, hot, hash-partitioned to spread update and vacuum load.
CREATE TABLE task_status (
  task_id          UUID NOT NULL,
  start_day        SMALLINT NOT NULL,
  status           TEXT NOT NULL DEFAULT 'queued'
                   CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'canceled', 'buffered')),
  attempt          INT NOT NULL DEFAULT 0,
  lease_token      UUID,
  lease_until      TIMESTAMPTZ,
  heartbeat_at     TIMESTAMPTZ,
  started_at       TIMESTAMPTZ,
  deadline_at      TIMESTAMPTZ,
  next_attempt_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  cancel_requested BOOLEAN NOT NULL DEFAULT false,
  worker_id        TEXT,
  last_error       TEXT,
  finished_at      TIMESTAMPTZ,
  updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (task_id)
) PARTITION BY HASH (task_id);

CREATE TABLE task_status_p0 PARTITION OF task_status FOR VALUES WITH (MODULUS 4, REMAINDER 0);
CREATE TABLE task_status_p1 PARTITION OF task_status FOR VALUES WITH (MODULUS 4, REMAINDER 1);
CREATE TABLE task_status_p2 PARTITION OF task_status FOR VALUES WITH (MODULUS 4, REMAINDER 2);
CREATE TABLE task_status_p3 PARTITION OF task_status FOR VALUES WITH (MODULUS 4, REMAINDER 3);

-- The reaper only ever looks at running rows.
CREATE INDEX task_status_running_idx ON task_status (lease_until) WHERE status = 'running';
CREATE INDEX task_status_deadline_idx ON task_status (deadline_at) WHERE status = 'running';
CREATE INDEX task_status_status_idx ON task_status (status);

-- One row per claim: who ran which attempt, and how it ended.
CREATE TABLE task_attempts (
  task_id      UUID NOT NULL,
  start_day    SMALLINT NOT NULL,
  attempt      INT NOT NULL,
  lease_token  UUID NOT NULL,
  worker_id    TEXT,
  started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
  finished_at  TIMESTAMPTZ,
  outcome      TEXT NOT NULL DEFAULT 'running'
               CHECK (outcome IN ('running', 'succeeded', 'failed', 'canceled', 'lease_expired', 'timed_out')),
  error        TEXT,
  PRIMARY KEY (start_day, task_id, attempt)
) PARTITION BY RANGE (start_day);

-- Events a task emitted, deduplicated by (producer_task_id, dataset_uuid, cursor|partition_key|range).
CREATE TABLE events (
  event_id          UUID NOT NULL,
  start_day         SMALLINT NOT NULL,      -- the producer task's start_day
  org_id            UUID NOT NULL,
  producer_task_id  UUID NOT NULL,
  producer_attempt  INT NOT NULL,
  dataset_uuid      UUID NOT NULL,
  dedupe_key        TEXT NOT NULL,          -- 'cursor:…' | 'partition:…' | 'range:start-end'
  cursor            TEXT,
  partition_key     TEXT,
  range_start       BIGINT,
  range_end         BIGINT,
  payload           JSONB NOT NULL DEFAULT '{}',
  created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (start_day, event_id),
  UNIQUE (start_day, producer_task_id, dataset_uuid, dedupe_key)
) PARTITION BY RANGE (start_day);

-- Enqueue intents: written in the same transaction as the intent, published later.
CREATE TABLE outbox (
  id             BIGSERIAL PRIMARY KEY,
  queue_name     TEXT NOT NULL,
  payload        JSONB NOT NULL,
  delay_seconds  INT NOT NULL DEFAULT 0,
  created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
  sent_at        TIMESTAMPTZ,
  publish_errors INT NOT NULL DEFAULT 0,
  last_error     TEXT
);

CREATE INDEX outbox_pending_idx ON outbox (id) WHERE sent_at IS NULL;
CREATE INDEX outbox_sent_idx ON outbox (sent_at) WHERE sent_at IS NOT NULL;

-- Monthly partitions of every start_day-partitioned table, created ahead. Safe to run
-- concurrently (advisory lock) and repeatedly (IF NOT EXISTS).
CREATE FUNCTION trace_ensure_partitions(months_ahead int DEFAULT 2, months_back int DEFAULT 1)
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
  FOREACH parent IN ARRAY ARRAY['task_registry', 'task_attempts', 'events'] LOOP
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

-- Wake the outbox publisher as soon as an intent commits (it polls as a fallback).
CREATE FUNCTION trace_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('trace_outbox', '');
  RETURN NULL;
END
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
FOR EACH STATEMENT EXECUTE FUNCTION trace_outbox_notify();
