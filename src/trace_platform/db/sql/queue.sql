-- Named queries of the pgqueue driver.

-- name: publish
-- One statement per batch: insert, then wake idle consumers of this queue.
WITH ins AS (
  -- Payloads travel as a binary text[] (no per-character escaping) and become jsonb here.
  INSERT INTO queue_messages (queue_name, payload, visible_at, max_attempts)
  SELECT %(queue)s, p::jsonb, now() + make_interval(secs => %(delay)s), %(max_attempts)s
  FROM unnest(%(payloads)b::text[]) AS t(p)
  RETURNING 1
)
SELECT count(*) AS n,
       CASE WHEN %(delay)s = 0 THEN pg_notify('trace_queue', %(queue)s) END AS notified
FROM ins;

-- name: receive
-- One statement: pick the oldest ready rows (SKIP LOCKED) and lease them. The picked ids go in
-- as an array, so the update finds each row by primary key (a join on a CTE lets the planner
-- hash-join against a sequential scan of the whole queue: O(backlog) per receive). Not by
-- ctid: for a row changed since this statement's snapshot, the pick locks and returns its
-- newest version, which the update's scan (this statement's snapshot) cannot see, so a row
-- still ready by this statement's clock (a delay-0 nack begun before it, committed after its
-- snapshot) was locked and neither leased nor returned. By id, the update reaches the
-- version it sees and Postgres rechecks the newest one, which the lease conditions, repeated
-- here, must still pass. The lease
-- token comes from the caller, one per batch: (id, token) still names exactly one lease, and
-- the driver builds the receipts without a per-row random UUID or string concatenation here.
-- The batch comes back as one row (ids, attempts, payloads as one JSON array): one decode for
-- the batch instead of one per message. NULLs when nothing was ready.
-- It first acks the caller's previous receipts (`receipts`, as in ack_many; '' for none), in
-- the same statement and so the same commit: one disk flush per batch instead of two (Oban
-- flushes acks with its next fetch). The rows it deleted are kept out of the pick (all CTEs
-- see one snapshot), so a message whose lease ran out is never both deleted and leased.
WITH settled AS (
  SELECT split_part(r, ':', 1)::bigint AS id, split_part(r, ':', 2)::uuid AS token
  FROM unnest(string_to_array(%(receipts)s, ',')) AS r
), acked AS (
  DELETE FROM queue_messages m
  USING settled s
  WHERE m.id = s.id AND m.lease_token = s.token
  RETURNING m.id
), leased AS (
  UPDATE queue_messages m
  SET lease_until = now() + make_interval(secs => %(visibility)s),
      lease_token = %(token)s,
      attempts = m.attempts + 1,
      -- Only the last allowed delivery sets it (see migration 0018): the other leases change
      -- no indexed column, so they are HOT updates.
      final_lease_until = CASE WHEN m.attempts + 1 >= m.max_attempts
                               THEN now() + make_interval(secs => %(visibility)s) END
  WHERE m.id = ANY(ARRAY(
    SELECT id
    FROM queue_messages
    WHERE queue_name = %(queue)s
      AND visible_at <= now()
      AND (lease_until IS NULL OR lease_until < now())
      AND attempts < max_attempts
      AND id <> ALL(ARRAY(SELECT id FROM acked))
    -- Matches queue_ready_idx, so the ready rows of this queue come straight off the index.
    ORDER BY visible_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
  ))
    AND (m.lease_until IS NULL OR m.lease_until < now())
    AND m.attempts < m.max_attempts
  RETURNING m.id, m.payload, m.attempts
)
SELECT array_agg(id ORDER BY id) AS ids,
       array_agg(attempts ORDER BY id) AS attempts,
       json_agg(payload ORDER BY id)::text AS payloads,
       (SELECT count(*) FROM acked) AS acked
FROM leased;

-- name: ack
DELETE FROM queue_messages
WHERE id = %(id)s AND lease_token = %(token)s;

-- name: ack_many
-- The receipts travel as one comma-separated string (validated by the driver): one parameter
-- to send instead of two arrays, split here.
DELETE FROM queue_messages m
USING (
  SELECT split_part(r, ':', 1)::bigint AS id, split_part(r, ':', 2)::uuid AS token
  FROM unnest(string_to_array(%(receipts)s, ',')) AS r
) AS r
WHERE m.id = r.id AND m.lease_token = r.token;

-- name: extend_visibility
UPDATE queue_messages
SET lease_until = now() + make_interval(secs => %(visibility)s),
    final_lease_until = CASE WHEN final_lease_until IS NOT NULL
                             THEN now() + make_interval(secs => %(visibility)s) END
WHERE id = %(id)s AND lease_token = %(token)s;

-- name: nack
UPDATE queue_messages
SET lease_until = NULL,
    lease_token = NULL,
    final_lease_until = NULL,
    last_error = %(error)s,
    visible_at = now() + make_interval(secs => %(delay)s)
WHERE id = %(id)s AND lease_token = %(token)s
RETURNING id, attempts >= max_attempts AS exhausted;

-- name: dead_letter
-- Messages whose final lease expired (their consumer died) move to queue_dead. Uses
-- queue_final_lease_idx, so it touches final leases only, whatever the backlog.
WITH moved AS (
  DELETE FROM queue_messages
  WHERE queue_name = %(queue)s
    AND final_lease_until < now()
    AND lease_until < now()
    AND attempts >= max_attempts
  RETURNING id, queue_name, payload, created_at, attempts, last_error
)
INSERT INTO queue_dead (id, queue_name, payload, created_at, attempts, last_error)
SELECT id, queue_name, payload, created_at, attempts,
       coalesce(last_error, 'visibility timeout expired on the final delivery')
FROM moved;

-- name: dead_letter_one
-- A message given back (nack) on its last allowed delivery.
WITH moved AS (
  DELETE FROM queue_messages
  WHERE id = %(id)s AND attempts >= max_attempts
  RETURNING id, queue_name, payload, created_at, attempts, last_error
)
INSERT INTO queue_dead (id, queue_name, payload, created_at, attempts, last_error)
SELECT id, queue_name, payload, created_at, attempts, last_error
FROM moved;

-- name: dead_letters
SELECT id, queue_name, payload, created_at, dead_at, attempts, last_error
FROM queue_dead
WHERE queue_name = %(queue)s
ORDER BY id;

-- name: next_visible
-- Seconds until a delayed message becomes visible or a lease runs out (NULL: nothing pending).
SELECT extract(epoch FROM least(
         min(visible_at) FILTER (WHERE visible_at > now()),
         min(lease_until) FILTER (WHERE lease_until > now())) - now()) AS seconds
FROM queue_messages
WHERE queue_name = %(queue)s AND attempts < max_attempts
  AND (visible_at > now() OR lease_until > now());
