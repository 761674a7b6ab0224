-- The hot_window sink writes Postgres data as a login in the NOLOGIN group `trace_sink_write`
-- (the embedded cluster creates the login `trace_sink`; on an external server grant the group to
-- a login of your own and set TRACE_DATA_DSN). The sink parses Parquet that users' pipelines
-- wrote, so its login gets only what loading a hot window needs:
--
-- * new `dataset_<hex>` schemas, through trace_sink_ddl.ensure_schema() only. No CREATE on the
--   database: a login that may create any schema could create one named like another login
--   (the superuser's "$user" comes first in its search_path) and shadow the state tables and
--   functions there;
-- * CREATE in the dataset schemas and in `published`; the tables and views it creates are its
--   own (COPY, DELETE, ALTER TABLE, CREATE INDEX, CREATE OR REPLACE VIEW);
-- * nothing in `public` (0009 took PUBLIC's USAGE there): no state table, function or sequence.
--
-- Roles are cluster-wide, grants per database (this runs in every database, and in the test
-- template its clones copy). The reader's grants on what the sink creates come from 0009's event
-- trigger, which runs as whoever creates the table or view: the sink, as its owner, may grant it.

DO $$
BEGIN
  IF to_regrole('trace_sink_write') IS NULL THEN
    CREATE ROLE trace_sink_write NOLOGIN;
  END IF;
EXCEPTION
  WHEN duplicate_object OR unique_violation THEN
    NULL;  -- the embedded cluster's start (or another database's migration) created it meanwhile
  WHEN insufficient_privilege THEN
    RAISE WARNING 'role trace_sink_write not created (needs CREATEROLE): create it as NOLOGIN '
      'and re-grant (migration 0010); the sink then writes with TRACE_DATA_DSN or the state login';
END $$;

-- The one way the sink makes a schema: a dataset's (or `published`, made by 0006 already). The
-- schema belongs to this migration's role; the sink's group gets USAGE and CREATE on it.
CREATE SCHEMA IF NOT EXISTS trace_sink_ddl;
REVOKE ALL ON SCHEMA trace_sink_ddl FROM PUBLIC;

CREATE FUNCTION trace_sink_ddl.ensure_schema(schema_name text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog
AS $$
BEGIN
  IF schema_name IS NULL
     OR (schema_name <> 'published' AND schema_name !~ '^dataset_[0-9a-f]{32}$') THEN
    RAISE EXCEPTION 'the sink may create only dataset_<uuid hex> schemas, not %',
      coalesce(quote_ident(schema_name), 'NULL')
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = schema_name) THEN
    EXECUTE format('CREATE SCHEMA IF NOT EXISTS %I', schema_name);
  END IF;
  -- Granted once (a GRANT on every load would rewrite the catalog row each time).
  IF to_regrole('trace_sink_write') IS NOT NULL
     AND NOT has_schema_privilege('trace_sink_write', schema_name, 'CREATE') THEN
    EXECUTE format('GRANT USAGE, CREATE ON SCHEMA %I TO trace_sink_write', schema_name);
  END IF;
END $$;

REVOKE ALL ON FUNCTION trace_sink_ddl.ensure_schema(text) FROM PUBLIC;

DO $$
BEGIN
  IF to_regrole('trace_sink_write') IS NULL THEN
    RETURN;
  END IF;
  GRANT USAGE ON SCHEMA trace_sink_ddl TO trace_sink_write;
  GRANT EXECUTE ON FUNCTION trace_sink_ddl.ensure_schema(text) TO trace_sink_write;
  IF to_regnamespace('published') IS NOT NULL THEN  -- made by 0006
    GRANT USAGE, CREATE ON SCHEMA published TO trace_sink_write;
  END IF;
END $$;

-- What a sink with the state login made before this (an upgrade) goes to the group, so that the
-- sink's login, a member, may keep loading it (DELETE, COPY, ALTER TABLE, CREATE OR REPLACE
-- VIEW all need the owner). Indexes and sequences follow their tables.
DO $$
DECLARE
  s name;
  r record;
BEGIN
  IF to_regrole('trace_sink_write') IS NULL THEN
    RETURN;
  END IF;
  FOR s IN SELECT nspname FROM pg_namespace WHERE nspname ~ '^dataset_[0-9a-f]{32}$' LOOP
    BEGIN
      EXECUTE format('GRANT USAGE, CREATE ON SCHEMA %I TO trace_sink_write', s);
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE WARNING 'cannot grant the sink schema % (not its owner)', s;
    END;
  END LOOP;
  FOR r IN
    SELECT c.oid::regclass AS rel, c.relkind
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.relkind IN ('r', 'p', 'v', 'm')
       AND (n.nspname ~ '^dataset_[0-9a-f]{32}$'
            OR (n.nspname = 'published' AND c.relkind IN ('v', 'm')))
       AND c.relowner <> 'trace_sink_write'::regrole  -- nor a sink login, a member of it:
       AND NOT EXISTS (SELECT 1 FROM pg_auth_members m
                        WHERE m.roleid = 'trace_sink_write'::regrole AND m.member = c.relowner)
  LOOP
    BEGIN
      EXECUTE format(
        'ALTER %s %s OWNER TO trace_sink_write',
        CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
        r.rel);
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE WARNING 'cannot give % to the sink (not its owner)', r.rel;
    END;
  END LOOP;
END $$;
