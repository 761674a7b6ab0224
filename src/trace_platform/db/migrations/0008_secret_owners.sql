-- Secrets get an owner and use_roles, and their values are stored encrypted (Fernet, sealed
-- by trace_platform.identity.vault with the install's secrets key).
--
-- Existing rows: SQL cannot encrypt with the install's key, so their plaintext moves to
-- `legacy_value` (nothing is lost) and every process that builds the control plane seals them
-- at start (ciphertext set, legacy_value cleared, one transaction). New writes can only store
-- ciphertext. Existing secrets were set by org admins only, so each gets the org's first admin
-- as its owner (NULL when the org has none: then only admins may use or change it).

ALTER TABLE secrets RENAME COLUMN value TO legacy_value;
ALTER TABLE secrets ALTER COLUMN legacy_value DROP NOT NULL;
ALTER TABLE secrets ADD COLUMN ciphertext TEXT;
ALTER TABLE secrets ADD COLUMN owner_user_id UUID REFERENCES users;
ALTER TABLE secrets ADD COLUMN use_roles TEXT[] NOT NULL DEFAULT '{}';
ALTER TABLE secrets ADD CONSTRAINT secrets_sealed_or_legacy
  CHECK (num_nonnulls(ciphertext, legacy_value) = 1);

UPDATE secrets s
SET owner_user_id = (
  SELECT u.user_id FROM users u
  WHERE u.org_id = s.org_id AND u.is_admin
  ORDER BY u.created_at, u.user_id
  LIMIT 1
);

CREATE INDEX secrets_owner_idx ON secrets (owner_user_id);
