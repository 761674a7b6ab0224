-- Key management (identity/, control/identity.py, docs/identity.md): API keys get a label, an
-- optional expiry, who made them and when they were last used; users can be removed. A user is
-- never deleted (DAG versions, secrets and grants name them): removal marks the row and revokes
-- its keys.
ALTER TABLE api_keys ADD COLUMN name TEXT;                           -- a label, not a secret
ALTER TABLE api_keys ADD COLUMN expires_at TIMESTAMPTZ;             -- refused from then on
ALTER TABLE api_keys ADD COLUMN created_by UUID REFERENCES users;   -- NULL: made at bootstrap
-- Written at most every few minutes per key (identity.LAST_USED_EVERY), never per request.
ALTER TABLE api_keys ADD COLUMN last_used_at TIMESTAMPTZ;
-- A rotated key's revoked_at may lie up to an hour ahead (its grace); a revoke sets it to now.
ALTER TABLE api_keys ADD CONSTRAINT api_keys_expiry_after_creation
  CHECK (expires_at IS NULL OR expires_at > created_at);
CREATE INDEX api_keys_user_idx ON api_keys (user_id);

ALTER TABLE users ADD COLUMN removed_at TIMESTAMPTZ;

-- Cross-process cache invalidation (trace_platform/db/invalidation.py): every API process keeps
-- `key hash -> user` in memory and LISTENs on `trace_invalidate`. A change to what a cached
-- entry says is announced by the database itself, whoever writes it (an API, the CLI, psql), and
-- is delivered when its transaction commits. The payload names what changed: the key's digest
-- (never the key) or the user's id. `last_used_at` is not announced: it changes no answer.
CREATE FUNCTION trace_invalidate_api_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('trace_invalidate', 'api_key:' || OLD.key_hash);
  RETURN NULL;
END $$;

CREATE TRIGGER api_keys_invalidate
  AFTER UPDATE OF key_hash, user_id, revoked_at, expires_at OR DELETE ON api_keys
  FOR EACH ROW EXECUTE FUNCTION trace_invalidate_api_key();

CREATE FUNCTION trace_invalidate_user() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('trace_invalidate', 'user:' || OLD.user_id::text);
  RETURN NULL;
END $$;

CREATE TRIGGER users_invalidate
  AFTER UPDATE OF org_id, name, is_admin, roles, removed_at OR DELETE ON users
  FOR EACH ROW EXECUTE FUNCTION trace_invalidate_user();
