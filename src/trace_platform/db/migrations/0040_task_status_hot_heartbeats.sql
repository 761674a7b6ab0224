-- Heartbeats as heap-only (HOT) updates: a heartbeat changes no indexed column, so its new row
-- version goes on the same page, adds no index entry, and the old one is pruned with the page
-- (no VACUUM needed for it). A heartbeat is the task_status table's commonest write by far (every
-- running task, every few seconds); measured before this (bench/tracking_bench.py): not one
-- heartbeat was HOT, each added an entry to every index that holds a running row.
--
-- What blocked HOT: lease_until was the key of task_status_lease_idx (the reaper's lapsed
-- leases, 0020), and the heartbeat set updated_at, the key of task_status_queued_idx (any
-- indexed column changed blocks HOT, even of a partial index the row is not in). The heartbeat no
-- longer touches updated_at (heartbeat_at says when it beat; updated_at is the last change of
-- state), and the reaper finds lapsed leases and passed deadlines in one read of the running
-- rows, off an index keyed by task_id alone (never changed), filtering lease_until and
-- deadline_at on the heap. That read is of every running task at each reaper tick (a fleet's
-- running tasks: bounded by its slots) in place of an index range of the lapsed ones: it trades
-- a small read once a second for index writes on every heartbeat. The status, in collation "C",
-- keeps the statement on this index whatever the statistics (see 0020).
DROP INDEX task_status_lease_idx;
DROP INDEX task_status_timeout_idx;
CREATE INDEX task_status_running_idx ON task_status (task_id)
  WHERE status COLLATE "C" = 'running' AND task_id IS NOT NULL;

-- Room on each page for a row's next versions (a HOT update needs its page to have space;
-- pruning makes it again). Rows written from now on leave a fifth of each page free.
ALTER TABLE task_status_p0 SET (fillfactor = 80);
ALTER TABLE task_status_p1 SET (fillfactor = 80);
ALTER TABLE task_status_p2 SET (fillfactor = 80);
ALTER TABLE task_status_p3 SET (fillfactor = 80);
