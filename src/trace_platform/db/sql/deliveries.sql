-- Deliveries (migration 0030): made when the sink lands an alert_deliveries batch; leased,
-- sent and settled by the Delivery Service; listed by `trace deliveries`.

-- name: insert_delivery
-- The first row of an idempotency key wins, body and all: the same key always sends the same
-- body. Returns nothing for a key already stored.
INSERT INTO deliveries (delivery_id, org_id, idempotency_key, destination, record_id, rule,
                        severity, event_time, body, status, reason, finished_at)
VALUES (%(delivery_id)s, %(org_id)s, %(idempotency_key)s, %(destination)s, %(record_id)s,
        %(rule)s, %(severity)s, %(event_time)s, %(body)s, %(status)s, %(reason)s,
        CASE WHEN %(status)s = 'suppressed' THEN now() END)
ON CONFLICT (org_id, idempotency_key) DO NOTHING
RETURNING delivery_id, status;

-- name: lease_due
-- Up to `limit` due deliveries, leased to this sender (its token fences their outcomes): pending
-- and due, or leased by a sender whose lease ran out. Each org with unsettled deliveries (found
-- by a loose scan of deliveries_org_due_idx: one probe per org) gets an equal share of the
-- batch, its oldest due first, so no org's backlog starves another's. Rows another sender is
-- leasing right now are skipped: any number of senders share the work without waiting.
WITH RECURSIVE orgs(org_id) AS (
  (SELECT org_id FROM deliveries WHERE status IN ('pending', 'sending')
   ORDER BY org_id LIMIT 1)
  UNION ALL
  SELECT (SELECT d.org_id FROM deliveries d
          WHERE d.status IN ('pending', 'sending') AND d.org_id > orgs.org_id
          ORDER BY d.org_id LIMIT 1)
  FROM orgs WHERE orgs.org_id IS NOT NULL
),
busy AS (  -- the orgs with a delivery due now (not only leased ones, or retries to come)
  SELECT o.org_id FROM orgs o
  WHERE o.org_id IS NOT NULL AND EXISTS (
    SELECT 1 FROM deliveries d
    WHERE d.org_id = o.org_id AND d.status IN ('pending', 'sending')
      AND ((d.status = 'pending' AND d.next_attempt_at <= now())
           OR (d.status = 'sending' AND d.lease_expires_at < now())))
),
due AS (
  SELECT x.delivery_id
  FROM busy CROSS JOIN LATERAL (
    SELECT d.delivery_id FROM deliveries d
    WHERE d.org_id = busy.org_id AND d.status IN ('pending', 'sending')
      AND ((d.status = 'pending' AND d.next_attempt_at <= now())
           OR (d.status = 'sending' AND d.lease_expires_at < now()))
    ORDER BY d.next_attempt_at
    LIMIT (SELECT greatest(1, %(limit)s / count(*)) FROM busy)
    FOR UPDATE SKIP LOCKED
  ) x
  LIMIT %(limit)s
)
UPDATE deliveries d
SET status = 'sending', lease_token = %(token)s,
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s),
    attempts = d.attempts + 1
FROM due
WHERE d.delivery_id = due.delivery_id
RETURNING d.*;

-- name: destinations_named
SELECT * FROM destinations WHERE org_id = %(org_id)s AND name = ANY(%(names)s);

-- name: destination
SELECT * FROM destinations WHERE org_id = %(org_id)s AND name = %(name)s;

-- name: insert_attempt
INSERT INTO delivery_attempts (delivery_id, attempt, started_at, status_code, latency_ms,
                               outcome, error, address)
VALUES (%(delivery_id)s, %(attempt)s, %(started_at)s, %(status_code)s, %(latency_ms)s,
        %(outcome)s, %(error)s, %(address)s)
ON CONFLICT DO NOTHING;

-- name: settle
-- The leased attempt's outcome, fenced by its token: a sender whose lease was taken over
-- changes nothing. `status` pending: retried at next_attempt_at.
UPDATE deliveries
SET status = %(status)s, reason = %(reason)s, lease_token = NULL, lease_expires_at = NULL,
    next_attempt_at = coalesce(%(next_attempt_at)s, next_attempt_at),
    finished_at = CASE WHEN %(status)s IN ('delivered', 'failed') THEN now() END
WHERE delivery_id = %(delivery_id)s AND lease_token = %(token)s AND status = 'sending'
RETURNING delivery_id;

-- name: retry
-- `trace deliveries retry`: a failed delivery pending again, now (its key and body unchanged).
UPDATE deliveries
SET status = 'pending', reason = NULL, next_attempt_at = now(), finished_at = NULL,
    created_at = now()
WHERE org_id = %(org_id)s AND delivery_id = %(delivery_id)s AND status = 'failed'
RETURNING delivery_id;

-- name: list_deliveries
SELECT delivery_id, idempotency_key, destination, rule, severity, event_time, status, reason,
       attempts, next_attempt_at, created_at, finished_at
FROM deliveries
WHERE org_id = %(org_id)s
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(destination)s::text IS NULL OR destination = %(destination)s)
ORDER BY created_at DESC, delivery_id
LIMIT %(limit)s;

-- name: delivery
SELECT * FROM deliveries WHERE org_id = %(org_id)s AND delivery_id = %(delivery_id)s;

-- name: attempts
SELECT attempt, started_at, finished_at, status_code, latency_ms, outcome, error, address
FROM delivery_attempts WHERE delivery_id = %(delivery_id)s ORDER BY attempt;

-- name: insert_destination
INSERT INTO destinations (org_id, name, url, secret, allow_private, created_by)
VALUES (%(org_id)s, %(name)s, %(url)s, %(secret)s, %(allow_private)s, %(created_by)s)
ON CONFLICT (org_id, name) DO NOTHING
RETURNING name;

-- name: set_destination
UPDATE destinations
SET enabled = coalesce(%(enabled)s::boolean, enabled),
    allow_private = coalesce(%(allow_private)s::boolean, allow_private),
    url = coalesce(%(url)s::text, url),
    secret = coalesce(%(secret)s::text, secret),
    updated_at = now()
WHERE org_id = %(org_id)s AND name = %(name)s
RETURNING name;

-- name: list_destinations
SELECT name, url, enabled, allow_private, created_at, updated_at
FROM destinations WHERE org_id = %(org_id)s ORDER BY name;

-- name: delivery_counts
SELECT status, count(*) AS n FROM deliveries WHERE org_id = %(org_id)s GROUP BY status;

-- name: alert_work_open
-- What of the org's alert pipeline is still under way: alert batches the sink has not landed,
-- alert jobs queued or running, deliveries not settled.
SELECT
  (SELECT count(*) FROM buffer_records r JOIN buffered_datasets b USING (dataset_uuid)
   WHERE b.org_id = %(org_id)s AND b.platform IS NOT NULL AND r.status = 'pending') AS batches,
  (SELECT count(*) FROM task_registry tr JOIN task_status ts USING (task_id)
   WHERE tr.org_id = %(org_id)s AND tr.operator IN ('alert_evaluate', 'alert_route')
     AND ts.status IN ('queued', 'running')) AS tasks,
  (SELECT count(*) FROM deliveries
   WHERE org_id = %(org_id)s AND status IN ('pending', 'sending')) AS deliveries;
