-- The Query Service's Postgres reads run as a login in the NOLOGIN group `trace_published_read`
-- (the embedded cluster creates the login `trace_query`; on an external server grant the group
-- to a login of your own and set TRACE_READ_DSN). The group may only SELECT the published data:
-- the UUID-named `dataset_<hex>` schemas and tables the hot_window sink creates, and the
-- `published` views. Nothing of the state tables, no CREATE anywhere.
--
-- Roles are cluster-wide, grants per database (this runs in every database, and in the test
-- template its clones copy). Tables the sink creates later are granted by an event trigger that
-- looks only at those schemas: default privileges cannot name schemas that do not exist yet
-- (the sink creates one per dataset), and global ones (FOR ROLE <sink's role>, no schema) would
-- also grant every later state table and every task_registry partition made at run time.

DO $$
BEGIN
  IF to_regrole('trace_published_read') IS NULL THEN
    CREATE ROLE trace_published_read NOLOGIN;
  END IF;
EXCEPTION
  WHEN duplicate_object OR unique_violation THEN
    NULL;  -- the embedded cluster's start (or another database's migration) created it meanwhile
  WHEN insufficient_privilege THEN
    RAISE WARNING 'role trace_published_read not created (needs CREATEROLE): create it as '
      'NOLOGIN and re-grant, see README "Query Service"; the Query Service then reads with '
      'TRACE_READ_DSN or the data login';
END $$;

-- State lives in `public`. PUBLIC's default USAGE there goes, so a login without its own grants
-- cannot reach any state table, function or future partition, whatever grants a table gets.
-- (Owners and superusers, i.e. every other Trace login, are unaffected.)
DO $$
BEGIN
  REVOKE ALL ON SCHEMA public FROM PUBLIC;
EXCEPTION WHEN insufficient_privilege THEN
  RAISE WARNING 'schema public keeps its PUBLIC privileges (not its owner)';
END $$;

-- Published data that exists already (an upgrade).
DO $$
DECLARE
  s name;
BEGIN
  IF to_regrole('trace_published_read') IS NULL THEN
    RETURN;
  END IF;
  FOR s IN
    SELECT nspname FROM pg_namespace
     WHERE nspname = 'published' OR nspname ~ '^dataset_[0-9a-f]{32}$'
  LOOP
    BEGIN
      EXECUTE format('GRANT USAGE ON SCHEMA %I TO trace_published_read', s);
      EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO trace_published_read', s);
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE WARNING 'cannot grant reads on schema % (not its owner)', s;
    END;
  END LOOP;
END $$;

-- Published data created later, by whichever role creates it (the sink's data login).
CREATE FUNCTION trace_grant_published_read() RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog
AS $$
DECLARE
  cmd record;
  s name;
BEGIN
  IF to_regrole('trace_published_read') IS NULL THEN
    RETURN;
  END IF;
  FOR cmd IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
    IF cmd.object_type = 'schema' THEN
      SELECT nspname INTO s FROM pg_namespace WHERE oid = cmd.objid;
      IF s = 'published' OR s ~ '^dataset_[0-9a-f]{32}$' THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO trace_published_read', s);
      END IF;
    ELSIF cmd.object_type IN ('table', 'view', 'materialized view')
          AND (cmd.schema_name = 'published' OR cmd.schema_name ~ '^dataset_[0-9a-f]{32}$') THEN
      EXECUTE format('GRANT SELECT ON %s TO trace_published_read', cmd.objid::regclass);
    END IF;
  END LOOP;
END $$;

REVOKE ALL ON FUNCTION trace_grant_published_read() FROM PUBLIC;

DO $$
BEGIN
  CREATE EVENT TRIGGER trace_grant_published_read ON ddl_command_end
    WHEN TAG IN ('CREATE SCHEMA', 'CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO',
                 'CREATE VIEW', 'CREATE MATERIALIZED VIEW')
    EXECUTE FUNCTION trace_grant_published_read();
EXCEPTION WHEN insufficient_privilege THEN
  RAISE WARNING 'event trigger trace_grant_published_read not created (needs a superuser): '
    'new published tables must be granted to trace_published_read by hand';
END $$;
