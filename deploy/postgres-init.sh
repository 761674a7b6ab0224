#!/bin/sh
# The postgres service runs this once, when its volume is first initialised
# (/docker-entrypoint-initdb.d): Trace's two least-privilege logins, as the embedded cluster of
# `trace up` makes them (db/embedded.py), with the passwords deploy/init-env.sh generated.
#   trace_sink  (TRACE_DATA_DSN): the sinks' data login, in trace_sink_write (migration 0010)
#   trace_query (TRACE_READ_DSN): the Query Service's, read-only, in trace_published_read (0009)
# The groups' grants come from the migrations the API runs on its first start.
set -eu

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v db="$POSTGRES_DB" \
    -v sink_password="$TRACE_PG_SINK_PASSWORD" \
    -v query_password="$TRACE_PG_QUERY_PASSWORD" <<'SQL'
SELECT format('CREATE ROLE %I NOLOGIN', g) FROM unnest(ARRAY['trace_sink_write',
    'trace_published_read']) AS g WHERE to_regrole(g) IS NULL
\gexec
SELECT format('CREATE ROLE %I LOGIN', u) FROM unnest(ARRAY['trace_sink', 'trace_query']) AS u
    WHERE to_regrole(u) IS NULL
\gexec
ALTER ROLE trace_sink LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
    NOBYPASSRLS PASSWORD :'sink_password';
ALTER ROLE trace_query LOGIN INHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
    NOBYPASSRLS PASSWORD :'query_password';
ALTER ROLE trace_query SET default_transaction_read_only = on;
GRANT trace_sink_write TO trace_sink;
GRANT trace_published_read TO trace_query;
-- Temporary tables are a PUBLIC default: the reader gets none of them.
REVOKE TEMPORARY ON DATABASE :"db" FROM PUBLIC;
SQL
