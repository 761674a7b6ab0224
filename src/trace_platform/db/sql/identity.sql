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
INSERT INTO api_keys (key_id, user_id, key_hash, prefix)
VALUES (%(key_id)s, %(user_id)s, %(key_hash)s, %(prefix)s);

-- name: user_has_key
SELECT 1 FROM api_keys WHERE user_id = %(user_id)s AND revoked_at IS NULL LIMIT 1;

-- name: authenticate
SELECT u.user_id, u.org_id, u.name, u.is_admin, u.roles
FROM api_keys k JOIN users u USING (user_id)
WHERE k.key_hash = %(key_hash)s AND k.revoked_at IS NULL;

-- name: set_roles
UPDATE users SET roles = %(roles)s, is_admin = %(is_admin)s
WHERE org_id = %(org_id)s AND name = %(name)s
RETURNING user_id;

-- name: lock_bootstrap
-- One first start at a time: concurrent processes of a new install wait, then find the admin.
SELECT pg_advisory_xact_lock(hashtext('trace_bootstrap'));
