-- Named queries of identity: orgs, users, API keys.

-- name: ensure_org
INSERT INTO orgs (org_id, name) VALUES (%(org_id)s, %(name)s)
ON CONFLICT DO NOTHING;

-- name: ensure_user
INSERT INTO users (user_id, org_id, name, is_admin, roles)
VALUES (%(user_id)s, %(org_id)s, %(name)s, %(is_admin)s, %(roles)s)
ON CONFLICT (org_id, name) DO NOTHING;

-- name: user_by_name
SELECT * FROM users WHERE org_id = %(org_id)s AND name = %(name)s;

-- name: insert_key
INSERT INTO api_keys (key_id, user_id, key_hash, prefix, name, expires_at, created_by)
VALUES (%(key_id)s, %(user_id)s, %(key_hash)s, %(prefix)s, %(name)s, %(expires_at)s,
        %(created_by)s)
RETURNING key_id, prefix, name, created_at, expires_at;

-- name: user_has_key
-- Any key ever made, live or not: the Lite admin's first key is made once, not again after
-- it was revoked (a revoked admin key must not come back as a new one on the next start).
SELECT 1 FROM api_keys WHERE user_id = %(user_id)s LIMIT 1;

-- name: authenticate
-- A live key of a user not removed: not revoked (a rotated key's revoked_at may lie ahead,
-- its grace), not expired. valid_until: when it stops, for a cache to enforce on its own.
SELECT u.user_id, u.org_id, u.name, u.is_admin, u.roles, k.key_id, k.last_used_at,
       nullif(least(coalesce(k.revoked_at, 'infinity'), coalesce(k.expires_at, 'infinity')),
              'infinity') AS valid_until,
       now() AS now
FROM api_keys k JOIN users u USING (user_id)
WHERE k.key_hash = %(key_hash)s AND u.removed_at IS NULL
  AND (k.revoked_at IS NULL OR k.revoked_at > now())
  AND (k.expires_at IS NULL OR k.expires_at > now());

-- name: touch_key
UPDATE api_keys SET last_used_at = now()
WHERE key_id = %(key_id)s
  AND (last_used_at IS NULL OR last_used_at < now() - make_interval(secs => %(every)s));

-- name: set_roles
-- Also brings a removed user back (an admin adding them again): the same user, new keys only.
UPDATE users SET roles = %(roles)s, is_admin = %(is_admin)s, removed_at = NULL
WHERE org_id = %(org_id)s AND name = %(name)s
RETURNING user_id;

-- name: lock_bootstrap
-- One first start at a time: concurrent processes of a new install wait, then find the admin.
SELECT pg_advisory_xact_lock(hashtext('trace_bootstrap'));

-- name: lock_org
-- Serialises an org's user and key changes: two admins demoting each other at once cannot
-- both see the other left as an admin.
SELECT org_id FROM orgs WHERE org_id = %(org_id)s FOR UPDATE;

-- name: list_users
SELECT u.user_id, u.name, u.is_admin, u.roles, u.created_at, u.removed_at,
       (SELECT count(*) FROM api_keys k
        WHERE k.user_id = u.user_id
          AND (k.revoked_at IS NULL OR k.revoked_at > now())
          AND (k.expires_at IS NULL OR k.expires_at > now())) AS live_keys
FROM users u
WHERE u.org_id = %(org_id)s AND (%(include_removed)s OR u.removed_at IS NULL)
ORDER BY u.name;

-- name: other_admins
-- The org's admins still there, besides this user.
SELECT count(*) AS n FROM users
WHERE org_id = %(org_id)s AND is_admin AND removed_at IS NULL AND user_id <> %(user_id)s;

-- name: remove_user
UPDATE users SET removed_at = now()
WHERE org_id = %(org_id)s AND name = %(name)s AND removed_at IS NULL
RETURNING user_id;

-- name: revoke_user_keys
UPDATE api_keys SET revoked_at = now()
WHERE user_id = %(user_id)s AND (revoked_at IS NULL OR revoked_at > now())
RETURNING key_id;

-- name: list_keys
-- An org's keys (never their digests): live ones, or every one with include_ended.
SELECT k.key_id, u.name AS user_name, k.name, k.prefix, k.created_at, c.name AS created_by,
       k.expires_at, k.revoked_at, k.last_used_at,
       CASE WHEN u.removed_at IS NOT NULL THEN 'user removed'
            WHEN k.revoked_at IS NOT NULL AND k.revoked_at <= now() THEN 'revoked'
            WHEN k.expires_at IS NOT NULL AND k.expires_at <= now() THEN 'expired'
            WHEN k.revoked_at IS NOT NULL THEN 'rotating'
            ELSE 'live' END AS state
FROM api_keys k
JOIN users u USING (user_id)
LEFT JOIN users c ON c.user_id = k.created_by
WHERE u.org_id = %(org_id)s
  AND (%(user_name)s::text IS NULL OR u.name = %(user_name)s)
  AND (%(include_ended)s OR (u.removed_at IS NULL
                             AND (k.revoked_at IS NULL OR k.revoked_at > now())
                             AND (k.expires_at IS NULL OR k.expires_at > now())))
ORDER BY u.name, k.created_at;

-- name: key_for_update
-- A key of the org's users; another org's key reads as absent.
SELECT k.key_id, k.user_id, k.name, k.prefix, k.created_at, k.expires_at, k.revoked_at,
       u.name AS user_name, u.removed_at,
       (k.revoked_at IS NOT NULL AND k.revoked_at <= now()) AS revoked,
       (k.expires_at IS NOT NULL AND k.expires_at <= now()) AS expired
FROM api_keys k JOIN users u USING (user_id)
WHERE k.key_id = %(key_id)s AND u.org_id = %(org_id)s
FOR UPDATE OF k;

-- name: revoke_key
-- Now (grace 0) or after a grace; never later than a revocation already set.
UPDATE api_keys
SET revoked_at = least(coalesce(revoked_at, 'infinity'), now() + make_interval(secs => %(grace)s))
WHERE key_id = %(key_id)s
RETURNING revoked_at;

-- name: admin_keys_left
-- Live keys of the org's admins (n): at least one must be left, or nobody can manage the org;
-- and of those the lasting ones (durable: no expiry, no revocation set, not even a rotation's
-- grace), so that no change leaves the org an admin key that will lapse on its own.
SELECT count(*) AS n,
       count(*) FILTER (WHERE k.revoked_at IS NULL AND k.expires_at IS NULL) AS durable
FROM api_keys k JOIN users u USING (user_id)
WHERE u.org_id = %(org_id)s AND u.is_admin AND u.removed_at IS NULL
  AND (k.revoked_at IS NULL OR k.revoked_at > now())
  AND (k.expires_at IS NULL OR k.expires_at > now());
