-- A whole-scope writer (sql_transform: it rewrites its output as one scope) runs one at a time
-- in its DAG, across pools: a deploy may move it to another pool while a run holds a slot of
-- the old one (dispatcher/slots.py).
--
-- pool_slots.leased_whole: the slot is held by a whole writer, so only such holders keep the
-- job's next run waiting (a run of the job under another operator, in an older version, does
-- not), and a pool's freed slot is not offered to a whole writer held elsewhere.
ALTER TABLE pool_slots ADD COLUMN leased_whole BOOLEAN NOT NULL DEFAULT false;

UPDATE pool_slots p
SET leased_whole = true
FROM task_registry r
WHERE r.task_id = p.leased_by_task AND r.operator = 'sql_transform';

-- task_status.whole_job: a pooled whole writer's job (NULL for every other task), written with
-- the row (insert_tasks) and never changed, so the release of its slot finds its runs queued
-- in other pools off a small index (waiting_for_job) instead of every queued task of the DAG.
ALTER TABLE task_status ADD COLUMN whole_job TEXT;

UPDATE task_status s
SET whole_job = r.job
FROM task_registry r
WHERE s.status IN ('queued', 'buffered', 'running')
  AND r.task_id = s.task_id AND r.start_day = s.start_day
  AND r.worker_pool IS NOT NULL AND r.operator = 'sql_transform';

-- The status in collation "C", as the statement compares it (see migrations 0020 and 0021).
CREATE INDEX task_status_whole_idx ON task_status (pool_dag_id, whole_job)
  WHERE status COLLATE "C" = 'queued' AND whole_job IS NOT NULL;
