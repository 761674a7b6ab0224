-- The audit log (migration 0036, trace_platform/audit.py): one row per user or admin action,
-- written in the action's transaction; read by an org's admins, newest first.

-- name: insert
-- start_day is the row's partition: the day of `at` (the action's transaction time).
INSERT INTO audit_log (start_day, org_id, actor_kind, actor_user_id, actor_name, actor_key_id,
                       action, target_kind, target, dag, outcome, source, request_id, details)
VALUES (trace_start_day(now()), %(org_id)s, %(actor_kind)s, %(actor_user_id)s, %(actor_name)s,
        %(actor_key_id)s, %(action)s, %(target_kind)s, %(target)s, %(dag)s, %(outcome)s,
        %(source)s, %(request_id)s, %(details)s)
RETURNING id;

-- name: ensure_partitions
-- The month of now() has no partition yet (no Dispatcher ran partition upkeep lately).
SELECT trace_ensure_partitions() AS created;

-- name: list
-- One org's rows newest first, between two start_days the caller computes as constants, so
-- the planner reads only the partitions of that range (from_day..to_day), then the exact
-- bounds on `at` and the page cursor (before_at, before_id).
SELECT id, at, actor_kind, actor_name AS actor, actor_user_id, actor_key_id, action,
       target_kind, target, dag, outcome, source, request_id, details
FROM audit_log
WHERE org_id = %(org_id)s
  AND start_day BETWEEN %(from_day)s AND %(to_day)s
  AND at >= %(since)s
  AND (at, id) < (%(before_at)s, %(before_id)s)
  AND (%(actor)s::text IS NULL OR actor_name = %(actor)s)
  AND (%(actor_kind)s::text IS NULL OR actor_kind = %(actor_kind)s)
  AND (%(action)s::text IS NULL OR action = %(action)s)
  AND (%(dag)s::text IS NULL OR dag = %(dag)s)
ORDER BY at DESC, id DESC
LIMIT %(limit)s;
