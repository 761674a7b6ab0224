-- Named queries of the outbox publisher.

-- name: claim_pending
-- Row locks keep concurrent publishers off each other's rows; a publisher killed before it
-- commits mark_sent releases them, and they are published again (at-least-once).
SELECT id, queue_name, payload, delay_seconds
FROM outbox
WHERE sent_at IS NULL
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: mark_sent
UPDATE outbox SET sent_at = now() WHERE id = ANY(%(ids)s);

-- name: mark_failed
UPDATE outbox SET publish_errors = publish_errors + 1, last_error = %(error)s
WHERE id = ANY(%(ids)s);

-- name: purge_sent
DELETE FROM outbox WHERE sent_at < now() - make_interval(secs => %(older_than)s);

-- name: pending_count
SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL;
