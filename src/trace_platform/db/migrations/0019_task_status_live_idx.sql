-- The status index finds a live task by its key too: (status, task_id) over the rows of live
-- work only, in place of task_status_status_idx (status alone, every row).
--
-- A statement that looks a task up by key and status (claim: task_id = $1 AND status =
-- 'queued'; heartbeat: ... AND status = 'running'; claim_many's lookup of each requested
-- task) may be planned on task_status_status_idx instead of the primary key: it does when the
-- statistics make the status look rare (a burst of queued tasks not yet analysed, or a long
-- history of finished tasks beside them), and the status index's correlation with the table's
-- order prices it below the key. That plan reads every task of that status in the partition to
-- keep one: measured, 5,000 rows for a claim among 20,000 queued tasks, 500 for a heartbeat
-- among 2,000 running ones, on every call of a generic plan made from such statistics. With
-- task_id in the index, that plan reads the one row whichever index it takes.
--
-- Partial: every reader by status wants live work (queued, buffered, running: the claims, the
-- rewake, the pools, a rollout's cancel and release, a purge's pins); finished tasks, nearly
-- all rows, leave the index (a task's last update adds no entry).
CREATE INDEX task_status_live_idx ON task_status (status, task_id)
  WHERE status IN ('queued', 'buffered', 'running');

DROP INDEX task_status_status_idx;
