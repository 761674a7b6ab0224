-- Named queries of worker pool slot secrets: owners, use_roles, values sealed by the vault.
-- No query here ever returns a value to a caller outside the Dispatcher's task-secrets path.

-- name: insert_secret
INSERT INTO secrets (org_id, name, ciphertext, owner_user_id, use_roles)
VALUES (%(org_id)s, %(name)s, %(ciphertext)s, %(owner)s, %(use_roles)s)
ON CONFLICT (org_id, name) DO NOTHING
RETURNING name;

-- name: secret_for_update
SELECT org_id, name, owner_user_id, use_roles FROM secrets
WHERE org_id = %(org_id)s AND name = %(name)s
FOR UPDATE;

-- name: update_secret
-- A NULL ciphertext or use_roles keeps the stored one. Whoever writes the value owns it (an
-- admin's overwrite takes a squatted name back from whoever created it first).
UPDATE secrets
SET ciphertext = coalesce(%(ciphertext)s::text, ciphertext),
    owner_user_id = %(owner)s,
    legacy_value = CASE WHEN %(ciphertext)s::text IS NULL THEN legacy_value END,
    use_roles = coalesce(%(use_roles)s::text[], use_roles),
    updated_at = now()
WHERE org_id = %(org_id)s AND name = %(name)s;

-- name: list_secrets
-- Every secret of the org, or only the one named (NULL: all).
SELECT s.name, s.org_id, s.owner_user_id, u.name AS owner, s.use_roles, s.updated_at
FROM secrets s
LEFT JOIN users u ON u.user_id = s.owner_user_id
WHERE s.org_id = %(org_id)s AND (%(name)s::text IS NULL OR s.name = %(name)s)
ORDER BY s.name;

-- name: secrets_named
-- Deploy: the secrets a DAG's worker pool slots name (absent ones have a NULL org_id).
SELECT n AS name, s.org_id, s.owner_user_id, s.use_roles
FROM unnest(%(names)s::text[]) AS n
LEFT JOIN secrets s ON s.org_id = %(org_id)s AND s.name = n
ORDER BY n;

-- name: legacy_plaintext
-- Rows written before migration 0008, still in plaintext until sealed at start.
SELECT org_id, name, legacy_value FROM secrets
WHERE legacy_value IS NOT NULL
FOR UPDATE;

-- name: seal_legacy
UPDATE secrets SET ciphertext = %(ciphertext)s, legacy_value = NULL
WHERE org_id = %(org_id)s AND name = %(name)s;
