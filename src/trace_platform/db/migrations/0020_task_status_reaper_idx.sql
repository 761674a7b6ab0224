-- The reaper's looks (every tick) read what they find, not every live task.
--  * The rewake (stranded_queued) looks for queued tasks nobody touched for a while. Its only
--    index was the live status index: it read every queued task to keep the stale ones
--    (20,000 rows at a backlog of 20,000, on every tick). task_status_queued_idx orders the
--    queued tasks by their last update: it reads the stale ones, oldest first, and stops.
--  * expired_leases picks the lapsed leases and the passed deadlines each off its own index
--    (task_status_lease_idx, _timeout_idx: task_status_running_idx and _deadline_idx again,
--    restated as below), in place of one scan of every running task.
--
-- Each predicate is written so that only the statement it is for can use the index, whatever
-- statistics a generic plan was made from (with a handful of rows, or with live tasks looking
-- rare beside a long history, every partial index of a status looks as cheap as any other):
--  * the status is compared in collation "C" (for a plain word, the same equality), as those
--    statements compare it: a plain `status = ...` (a claim's, a heartbeat's) cannot use
--    these, and those statements cannot use the live status index (default collation). With
--    plain predicates, a claim's lookup by key and status scanned the whole queued index
--    (5,000 rows of a partition of 20,000 queued), and the rewake and the reaper scanned the
--    live index (every queued, or every running, task).
--  * `col IS NOT NULL` (true of every row the index is for) names the column the statement
--    bounds: a look for lapsed leases cannot take the deadline index and filter every running
--    task on its lease, nor the other way round.
--
-- Partial: only queued (or running) rows enter them. Heartbeats change lease_until, already
-- indexed; the rewake's touch of a queued row is no longer a heap-only update.
CREATE INDEX task_status_queued_idx ON task_status (updated_at)
  WHERE status COLLATE "C" = 'queued' AND updated_at IS NOT NULL;
CREATE INDEX task_status_lease_idx ON task_status (lease_until)
  WHERE status COLLATE "C" = 'running' AND lease_until IS NOT NULL;
CREATE INDEX task_status_timeout_idx ON task_status (deadline_at)
  WHERE status COLLATE "C" = 'running' AND deadline_at IS NOT NULL;

DROP INDEX task_status_running_idx;
DROP INDEX task_status_deadline_idx;
