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

-- name: _settle
-- The caller's receipts settled (acked), whichever way their messages were leased. They come
-- grouped by lease token, as one string the driver validated and built (`_grouped`):
-- "token=id|id|...;token=id": one uuid and one bigint[] to parse per batch, not two values
-- per receipt (measured: settling by token alone took batch 100 from 0.65x to 0.84x bare).
-- A receipt settles only through its own queue's name (`queue`), as an SQS receipt does.
acks AS (
  SELECT split_part(g, '=', 1)::uuid AS token,
         string_to_array(split_part(g, '=', 2), '|')::bigint[] AS ids
  FROM unnest(string_to_array(%(receipts)s, ';')) AS g
), acked_in_place AS (
  -- Rows leased in place (a small receive, or an older version). A batch's receipts are not
  -- looked for there: queue_messages' index holds the dead entries of every batch's deleted
  -- rows (measured: +5% at batch 100).
  DELETE FROM queue_messages m
  USING (SELECT a.token, unnest(a.ids) AS id
         FROM acks a
         WHERE NOT EXISTS (SELECT 1 FROM queue_leases l WHERE l.token = a.token)) AS s
  WHERE m.id = s.id AND m.lease_token = s.token AND m.queue_name = %(queue)s
  RETURNING m.id
), locked AS (
  -- The batches named, locked first: a settle of the same batch committed meanwhile is then
  -- seen (FOR UPDATE returns the newest version), and `released`, `thinned` and their counts
  -- decide on what they hold now. (Deciding in their own conditions lost acks: one that was
  -- false on this statement's snapshot is never rechecked, so of two acks of a batch's last
  -- two messages, the second neither released nor thinned it.)
  SELECT l.token, l.held, a.ids,
         ARRAY(SELECT unnest(l.held) EXCEPT SELECT unnest(a.ids)) AS kept
  FROM queue_leases l
  JOIN acks a ON a.token = l.token
  WHERE l.queue_name = %(queue)s
  -- Locked in one order, whatever the receipts' order: two settles naming the same batches
  -- in opposite orders deadlocked (found by review: a worker's lingering acks and its next
  -- receive's).
  ORDER BY l.token
  FOR UPDATE OF l
), released AS (
  -- Batches whose every held message is acked.
  DELETE FROM queue_leases l
  USING locked k
  WHERE l.token = k.token AND k.kept = '{}' AND k.held <> '{}'
  RETURNING cardinality(k.held) AS n
), thinned AS (
  -- Batches with messages still held: the acked ones leave `held`.
  UPDATE queue_leases l
  SET held = k.kept
  FROM locked k
  WHERE l.token = k.token AND k.kept <> '{}' AND cardinality(k.kept) < cardinality(k.held)
  RETURNING cardinality(k.held) - cardinality(k.kept) AS n
)

-- name: _settled
-- How many messages `_settle` acked.
(SELECT count(*) FROM acked_in_place)
         + (SELECT coalesce(sum(n), 0) FROM released)
         + (SELECT coalesce(sum(n), 0) FROM thinned)

-- name: _expired
-- Whether a batch lease of the queue has run out (the driver then `restore`s it).
EXISTS (SELECT 1 FROM queue_leases WHERE queue_name = %(queue)s AND lease_until < now())

-- name: _pick
-- The ids of the oldest ready messages of the queue, up to `limit`, locked (SKIP LOCKED),
-- after `_settle` (not those it just acked). Matches queue_ready_idx, so the ready rows of
-- this queue come straight off the index.
ARRAY(
  SELECT id
  FROM queue_messages
  WHERE queue_name = %(queue)s
    AND visible_at <= now()
    AND (lease_until IS NULL OR lease_until < now())
    AND attempts < max_attempts
    AND id <> ALL(ARRAY(SELECT id FROM acked_in_place))
  ORDER BY visible_at, id
  LIMIT %(limit)s
  FOR UPDATE SKIP LOCKED
)

-- name: receive
-- One statement: settle the caller's previous receipts, pick the oldest ready rows (SKIP
-- LOCKED), and lease them as one batch (migration 0024): the picked rows are deleted here and
-- kept, as they were, in one queue_leases row under the batch's token, from which an expired
-- lease puts them back (`restore`). The picked ids go in as an array, so the delete finds
-- each row by primary key (a join on a CTE lets the planner hash-join against a sequential
-- scan of the whole queue: O(backlog) per receive), and the ready conditions are repeated
-- there, since Postgres rechecks them on a row changed since this statement's snapshot.
-- The lease token comes from the caller, one per batch: (id, token) names exactly one lease.
-- The batch comes back as one row (ids, delivery counts, payloads as one JSON array): one
-- decode for the batch. NULLs when nothing was ready. `expired` says a lease of this queue
-- has run out, for the driver to `restore` it.
-- The caller's previous receipts (`receipts`, as in ack_many; '' for none) are acked in the
-- same statement and so the same commit: one disk flush per batch instead of two (Oban
-- flushes acks with its next fetch).
WITH {{_settle}}, picked AS (
  DELETE FROM queue_messages m
  WHERE m.id = ANY({{_pick}})
    AND m.visible_at <= now()
    AND (m.lease_until IS NULL OR m.lease_until < now())
    AND m.attempts < m.max_attempts
  RETURNING m.id, m.payload, m.attempts, m.max_attempts, m.created_at, m.last_error
), held AS (
  INSERT INTO queue_leases (token, queue_name, lease_until, held, ids, attempts, max_attempts,
                            created_at, last_error, payloads)
  -- One sort feeds every aggregate (each with its own ORDER BY sorted on its own).
  SELECT %(token)s, %(queue)s, now() + make_interval(secs => %(visibility)s),
         array_agg(id), array_agg(id), array_agg(attempts), array_agg(max_attempts),
         array_agg(created_at), array_agg(last_error), jsonb_agg(payload)
  FROM (SELECT * FROM picked ORDER BY id) AS p
  HAVING count(*) > 0
  RETURNING ids, attempts, payloads
)
-- The batch as its lease row holds it, with this delivery counted.
SELECT ids, ARRAY(SELECT n + 1 FROM unnest(attempts) AS n) AS attempts,
       payloads::text AS payloads,
       {{_settled}} AS acked,
       {{_expired}} AS expired
FROM (SELECT 1) AS one LEFT JOIN held ON true;

-- name: receive_in_place
-- A small batch (the driver's BATCH_LEASE_MIN) leased in place: each picked row is updated
-- with the lease (a HOT update, see migration 0018), which costs less than a lease row for a
-- handful of messages, acked a few at a time. Otherwise as `receive`.
WITH {{_settle}}, leased AS (
  UPDATE queue_messages m
  SET lease_until = now() + make_interval(secs => %(visibility)s),
      lease_token = %(token)s,
      attempts = m.attempts + 1,
      -- Only the last allowed delivery sets it (see migration 0018): the other leases change
      -- no indexed column, so they are HOT updates.
      final_lease_until = CASE WHEN m.attempts + 1 >= m.max_attempts
                               THEN now() + make_interval(secs => %(visibility)s) END
  WHERE m.id = ANY({{_pick}})
    AND (m.lease_until IS NULL OR m.lease_until < now())
    AND m.attempts < m.max_attempts
  RETURNING m.id, m.payload, m.attempts
)
SELECT array_agg(id ORDER BY id) AS ids,
       array_agg(attempts ORDER BY id) AS attempts,
       json_agg(payload ORDER BY id)::text AS payloads,
       {{_settled}} AS acked,
       {{_expired}} AS expired
FROM leased;

-- name: ack_many
-- The receipts, grouped by token as `_settle` takes them. Counts the messages acked.
WITH {{_settle}}
SELECT {{_settled}} AS acked;

-- name: restore
-- Expired leases of this queue: their messages still held go back, ready now, with the
-- delivery counted (or to queue_dead when it was their last), in one statement. Not the
-- batches the calling receive leased itself (`mine`): put back and leased again by the same
-- call (a lease shorter than the call), a message came back to it twice.
WITH expired AS (
  DELETE FROM queue_leases
  WHERE token = ANY(ARRAY(
    SELECT token FROM queue_leases
    WHERE queue_name = %(queue)s AND lease_until < now() AND token <> ALL(%(mine)s::uuid[])
    ORDER BY lease_until
    LIMIT 1000
    FOR UPDATE SKIP LOCKED
  ))
    AND lease_until < now()
  RETURNING *
), back AS (
  -- Each array read once, side by side, and the held ones kept by a hashed semi-join.
  -- (`payloads -> n` per message read the whole array each time, and `= ANY(held)` scanned
  -- it: measured, 10.7 s to put back one expired batch of 10,000 messages, 0.06 s this way.)
  SELECT e.queue_name, m.id, m.payload, m.created_at, m.attempts, m.max_attempts, m.last_error
  FROM expired e,
       ROWS FROM (unnest(e.ids), jsonb_array_elements(e.payloads), unnest(e.created_at),
                  unnest(e.attempts), unnest(e.max_attempts), unnest(e.last_error))
         AS m(id, payload, created_at, attempts, max_attempts, last_error)
  WHERE (e.token, m.id) IN (SELECT h.token, unnest(h.held) FROM expired h)
), dead AS (
  INSERT INTO queue_dead (id, queue_name, payload, created_at, attempts, last_error)
  SELECT id, queue_name, payload, created_at, attempts + 1,
         coalesce(last_error, 'visibility timeout expired on the final delivery')
  FROM back
  WHERE attempts + 1 >= max_attempts
  RETURNING 1
), ready AS (
  INSERT INTO queue_messages (id, queue_name, payload, created_at, visible_at, attempts,
                              max_attempts, last_error)
  SELECT id, queue_name, payload, created_at, now(), attempts + 1, max_attempts, last_error
  FROM back
  WHERE attempts + 1 < max_attempts
  RETURNING 1
)
SELECT (SELECT count(*) FROM ready) AS ready, (SELECT count(*) FROM dead) AS dead;

-- name: extend_visibility
-- A batch's lease is extended as a whole: a message's siblings in it are held as long, so
-- while it holds others it is never shortened (see QueueDriver.extend_visibility); a batch
-- down to this one message is set exactly, like a lease in place.
WITH in_place AS (
  UPDATE queue_messages
  SET lease_until = now() + make_interval(secs => %(visibility)s),
      final_lease_until = CASE WHEN final_lease_until IS NOT NULL
                               THEN now() + make_interval(secs => %(visibility)s) END
  WHERE id = %(id)s AND lease_token = %(token)s AND queue_name = %(queue)s
  RETURNING 1
), held AS (
  UPDATE queue_leases
  SET lease_until = CASE WHEN held = ARRAY[%(id)s::bigint]
                         THEN now() + make_interval(secs => %(visibility)s)
                         ELSE greatest(lease_until, now() + make_interval(secs => %(visibility)s))
                    END
  WHERE token = %(token)s AND %(id)s = ANY(held) AND queue_name = %(queue)s
  RETURNING 1
)
SELECT (SELECT count(*) FROM in_place) + (SELECT count(*) FROM held) AS extended;

-- name: nack
-- The message leaves its lease: back in queue_messages, visible after `delay`, with the
-- delivery counted and the error kept; `exhausted` when that was its last delivery (the
-- driver then dead-letters it).
WITH in_place AS (
  UPDATE queue_messages
  SET lease_until = NULL,
      lease_token = NULL,
      final_lease_until = NULL,
      last_error = %(error)s,
      visible_at = now() + make_interval(secs => %(delay)s)
  WHERE id = %(id)s AND lease_token = %(token)s AND queue_name = %(queue)s
  RETURNING id, attempts >= max_attempts AS exhausted
), taken AS (
  -- Its batch, locked (the newest version, as in `_settle`), then thinned, or deleted when
  -- this was the last message it held.
  SELECT * FROM queue_leases
  WHERE token = %(token)s AND %(id)s = ANY(held) AND queue_name = %(queue)s
  FOR UPDATE
), emptied AS (
  DELETE FROM queue_leases l
  USING taken t
  WHERE l.token = t.token AND t.held = ARRAY[%(id)s::bigint]
  RETURNING 1
), thinned AS (
  UPDATE queue_leases l
  SET held = array_remove(t.held, %(id)s::bigint)
  FROM taken t
  WHERE l.token = t.token AND cardinality(t.held) > 1
  RETURNING 1
), back AS (
  INSERT INTO queue_messages (id, queue_name, payload, created_at, visible_at, attempts,
                              max_attempts, last_error)
  SELECT m.id, t.queue_name, t.payloads -> (m.n - 1)::int, m.created_at,
         now() + make_interval(secs => %(delay)s), m.attempts + 1, m.max_attempts, %(error)s
  FROM taken t,
       unnest(t.ids, t.attempts, t.max_attempts, t.created_at)
         WITH ORDINALITY AS m(id, attempts, max_attempts, created_at, n)
  WHERE m.id = %(id)s
  RETURNING id, attempts >= max_attempts AS exhausted
)
SELECT id, exhausted FROM in_place
UNION ALL
SELECT id, exhausted FROM back;

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
         (SELECT min(visible_at) FILTER (WHERE visible_at > now())
          FROM queue_messages
          WHERE queue_name = %(queue)s AND attempts < max_attempts AND visible_at > now()),
         (SELECT min(lease_until) FROM queue_messages
          WHERE queue_name = %(queue)s AND attempts < max_attempts AND lease_until > now()),
         (SELECT min(lease_until) FROM queue_leases
          WHERE queue_name = %(queue)s AND lease_until > now())) - now()) AS seconds;
