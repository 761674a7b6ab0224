-- task_retries by month, as every other per-task history table (task_attempts, events): keyed by
-- the task's start_day and range-partitioned on it, so retention exports and drops a month's
-- retries with the month's tasks (0041's table was unpartitioned: its rows outlived their
-- tasks for ever). trace_ensure_partitions keeps it ahead (it finds the table in the catalog).
ALTER TABLE task_retries RENAME TO task_retries_0041;

CREATE TABLE task_retries (
  task_id       UUID NOT NULL,
  start_day     SMALLINT NOT NULL,
  after_attempt INT NOT NULL,
  run_id        UUID,
  retried_by    UUID,
  created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (start_day, task_id, after_attempt)
) PARTITION BY RANGE (start_day);

-- A partition for every month the registry still holds (its tasks may be retried), with the
-- registry's bounds; then the months trace_ensure_partitions keeps.
DO $$
DECLARE
  p record;
BEGIN
  FOR p IN
    SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS bound
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'task_registry'::regclass
  LOOP
    EXECUTE format('CREATE TABLE %I PARTITION OF task_retries %s',
                   'task_retries' || substr(p.relname, length('task_registry') + 1), p.bound);
  END LOOP;
END
$$;
SELECT trace_ensure_partitions();

-- A retry of a task no longer in Postgres counts for nothing: it is not carried over. By its
-- registry row, whose month has its partition above (a status row may outlive its month's
-- registry: one changed after retention exported it is not deleted).
INSERT INTO task_retries (task_id, start_day, after_attempt, run_id, retried_by, created_at)
SELECT o.task_id, r.start_day, o.after_attempt, o.run_id, o.retried_by, o.created_at
FROM task_retries_0041 o JOIN task_registry r ON r.task_id = o.task_id;

DROP TABLE task_retries_0041;
