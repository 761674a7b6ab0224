-- Named queries of the pgqueue driver.

-- name: publish
-- One statement per batch: insert, then wake idle consumers of this queue.
WITH ins AS (
  INSERT INTO queue_messages (queue_name, payload, visible_at, max_attempts)
  SELECT %(queue)s, p, now() + make_interval(secs => %(delay)s), %(max_attempts)s
  FROM unnest(%(payloads)s::jsonb[]) AS p
  RETURNING 1
)
SELECT count(*) AS n,
       CASE WHEN %(delay)s = 0 THEN pg_notify('trace_queue', %(queue)s) END AS notified
FROM ins;

-- name: receive
WITH picked AS (
  SELECT id
  FROM queue_messages
  WHERE queue_name = %(queue)s
    AND visible_at <= now()
    AND (lease_until IS NULL OR lease_until < now())
    AND attempts < max_attempts
  ORDER BY id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
)
UPDATE queue_messages m
SET lease_until = now() + make_interval(secs => %(visibility)s),
    lease_token = gen_random_uuid(),
    attempts = m.attempts + 1
FROM picked
WHERE m.id = picked.id
RETURNING m.id, m.payload, m.lease_token, m.attempts;

-- name: ack
DELETE FROM queue_messages
WHERE id = %(id)s AND lease_token = %(token)s;

-- name: ack_many
DELETE FROM queue_messages m
USING unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS r(id, token)
WHERE m.id = r.id AND m.lease_token = r.token;

-- name: extend_visibility
UPDATE queue_messages
SET lease_until = now() + make_interval(secs => %(visibility)s)
WHERE id = %(id)s AND lease_token = %(token)s;

-- name: nack
UPDATE queue_messages
SET lease_until = NULL,
    lease_token = NULL,
    last_error = %(error)s,
    visible_at = now() + make_interval(secs => %(delay)s)
WHERE id = %(id)s AND lease_token = %(token)s
RETURNING attempts >= max_attempts AS exhausted;

-- name: dead_letter
-- Messages out of deliveries and not currently leased move to queue_dead.
WITH moved AS (
  DELETE FROM queue_messages
  WHERE queue_name = %(queue)s
    AND attempts >= max_attempts
    AND (lease_until IS NULL OR lease_until < now())
  RETURNING id, queue_name, payload, created_at, attempts, last_error
)
INSERT INTO queue_dead (id, queue_name, payload, created_at, attempts, last_error)
SELECT id, queue_name, payload, created_at, attempts,
       coalesce(last_error, 'visibility timeout expired on the final delivery')
FROM moved;

-- name: dead_letters
SELECT id, queue_name, payload, created_at, dead_at, attempts, last_error
FROM queue_dead
WHERE queue_name = %(queue)s
ORDER BY id;

-- name: next_visible
SELECT extract(epoch FROM min(visible_at) - now()) AS seconds
FROM queue_messages
WHERE queue_name = %(queue)s AND attempts < max_attempts;
