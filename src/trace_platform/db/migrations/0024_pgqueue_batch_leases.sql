-- A lease per batch (see queue.sql, receive). A receive moves the messages it leases out of
-- queue_messages into one row here, whose token is the batch's; their receipts stay
-- "{id}:{token}". Per message that is the row lock and the delete the bare SKIP LOCKED loop
-- makes, instead of a lock, a row update and a later delete; the lease costs one insert and one
-- delete per batch. `held` lists the messages still held (an ack or a nack takes its message
-- out); the other arrays keep, position by position, each leased row's fields as they were
-- before the lease, so an expired lease puts back what it still holds (or dead-letters those
-- on their final delivery). Typed arrays, not a jsonb of whole rows: measured, turning each
-- row into jsonb (its timestamps formatted as text) took the batch receive from 1.5x the bare
-- loop's rate to 0.6x.
-- Rows leased in place by an older version (queue_messages.lease_token) are still honoured:
-- the pick skips them while their lease runs, and their receipts still ack them.
CREATE TABLE queue_leases (
  token        UUID PRIMARY KEY,
  queue_name   TEXT NOT NULL,
  lease_until  TIMESTAMPTZ NOT NULL,
  held         BIGINT[] NOT NULL,
  ids          BIGINT[] NOT NULL,
  attempts     INT[] NOT NULL,
  max_attempts INT[] NOT NULL,
  created_at   TIMESTAMPTZ[] NOT NULL,
  last_error   TEXT[] NOT NULL,
  payloads     JSONB NOT NULL  -- an array, in the order of `ids`
);

CREATE INDEX queue_leases_until_idx ON queue_leases (queue_name, lease_until);

-- Every row is inserted and deleted within a lease: vacuumed as often as queue_messages.
ALTER TABLE queue_leases SET (
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0
);
