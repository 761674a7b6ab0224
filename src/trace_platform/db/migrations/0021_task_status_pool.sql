-- A freed pool slot wakes the pool's queued tasks (waiting_for_pool). A pool is a registry
-- property (dag_id, worker_pool) and being queued a status one, so no index held both: the
-- statement read every task the pool ever ran (task_registry_pool_idx) and each one's status
-- by key to keep the queued ones, a read growing with the pool's age (20,000 rows for a
-- history of 20,000, on every slot released). A pooled task's status row now carries its
-- pool, written with it (insert_tasks) and never changed, and an index holds the queued tasks
-- of each pool.
--
-- NULL for a task without a pool (nearly all: the row stays as small). Filled here for live
-- tasks only: a finished task is never queued again (only a running task's retry and a
-- buffered task's release queue a task).
ALTER TABLE task_status ADD COLUMN pool_dag_id UUID, ADD COLUMN worker_pool TEXT;

UPDATE task_status s
SET pool_dag_id = r.dag_id, worker_pool = r.worker_pool
FROM task_registry r
WHERE s.status IN ('queued', 'buffered', 'running')
  AND r.task_id = s.task_id AND r.start_day = s.start_day AND r.worker_pool IS NOT NULL;

-- The status is compared in collation "C", as waiting_for_pool compares it (see migration
-- 0020): only that statement can use this index, and it can use no other status index. With
-- a plain `status = 'queued'`, a plan made from statistics in which queued tasks looked rare
-- took the live status index instead (well correlated with the table, it looked cheaper) and
-- read every queued task.
CREATE INDEX task_status_pool_idx ON task_status (pool_dag_id, worker_pool)
  WHERE status COLLATE "C" = 'queued' AND worker_pool IS NOT NULL;
