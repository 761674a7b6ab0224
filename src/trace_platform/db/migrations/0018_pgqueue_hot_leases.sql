-- pgqueue leases become HOT updates (heap-only: no new index entries, a fraction of the WAL).
-- A lease changes lease_until, lease_token and attempts; an update stays heap-only when no
-- indexed column changes and the page has room for the new row version. So:
--  * queue_lease_idx (queue_name, lease_until) goes: every lease changed its key.
--  * the dead-letter sweep, its only user, finds expired final leases through
--    final_lease_until instead: set (to lease_until) only on a message's last allowed
--    delivery, NULL otherwise, so an ordinary lease leaves it, and its index, untouched.
--  * fillfactor 50 leaves each page room for the leased versions of its rows.
ALTER TABLE queue_messages ADD COLUMN final_lease_until TIMESTAMPTZ;

UPDATE queue_messages
SET final_lease_until = lease_until
WHERE attempts >= max_attempts AND lease_until IS NOT NULL;

CREATE INDEX queue_final_lease_idx
  ON queue_messages (queue_name, final_lease_until)
  WHERE final_lease_until IS NOT NULL;

DROP INDEX queue_lease_idx;

ALTER TABLE queue_messages SET (fillfactor = 50);
