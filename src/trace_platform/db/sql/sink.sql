-- The sink's statements on Postgres data (its own login), over one buffered dataset's table.
-- Templates: {table}, {stage}, {columns}, {names} and {key} are filled in as identifiers
-- (psycopg.sql) by store/sink.py; every value travels as a parameter or through COPY.

-- name: create_table
-- org_id and record_id come from the trusted buffer record, never from a batch's rows.
CREATE TABLE IF NOT EXISTS {table} (
  org_id     uuid NOT NULL,
  {columns},
  record_id  uuid NOT NULL,
  loaded_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (org_id, {key})
);

-- name: copy_table
-- A batch COPYed into {table}: the dataset's table when all its keys are new (one pass; a
-- stored key fails it), else the stage the upsert below reads.
COPY {table} ({names}) FROM STDIN;

-- name: create_stage
CREATE TEMP TABLE {stage} (LIKE {table} INCLUDING DEFAULTS) ON COMMIT DROP;

-- name: upsert
-- Idempotent: a row whose key is stored already (a batch published twice, a sink retried
-- after a crash) is left as it is.
INSERT INTO {table} ({names})
SELECT {names} FROM {stage}
ON CONFLICT (org_id, {key}) DO NOTHING;

-- name: lock_table
SELECT pg_advisory_xact_lock(hashtext(%(table)s));

-- name: ensure_schema
SELECT trace_sink_ddl.ensure_schema(%(schema)s);
