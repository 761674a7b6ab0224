-- The buffered-dataset sink (`trace sink`) stages each batch in a temporary table (COPY into
-- it, then one INSERT … ON CONFLICT into the dataset's table: db/sql/sink.sql). The embedded
-- cluster takes TEMPORARY from PUBLIC (the Query Service's reader gets none), which left the
-- sink's login unable to load any batch there: every one dead-lettered ("permission denied to
-- create temporary tables"). Its group gets TEMPORARY on this database back: a temporary table
-- is its own session's, and reaches nothing of the state.
DO $$
BEGIN
  IF to_regrole('trace_sink_write') IS NOT NULL THEN
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO trace_sink_write', current_database());
  END IF;
END $$;
