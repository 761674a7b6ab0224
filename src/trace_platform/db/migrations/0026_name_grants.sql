-- Published names belong to the org's admins (issue 38): an admin grants a name, or a prefix
-- (`team_a_*`), to a user or a role; a name an admin reclaimed from a DAG is no longer that
-- DAG's to publish. The platform's reserved names (registry/names.py) need no row.

CREATE TABLE name_grants (
  org_id      UUID NOT NULL REFERENCES orgs,
  pattern     TEXT NOT NULL CHECK (pattern ~ '^[a-z][a-z0-9_]{0,127}\*?$'),
  user_id     UUID REFERENCES users,
  role        TEXT CHECK (role ~ '^[a-z][a-z0-9_]{0,127}$'),
  granted_by  UUID NOT NULL REFERENCES users,
  granted_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  CHECK ((user_id IS NULL) <> (role IS NULL))
);
CREATE UNIQUE INDEX name_grants_user_idx ON name_grants (org_id, pattern, user_id)
  WHERE user_id IS NOT NULL;
CREATE UNIQUE INDEX name_grants_role_idx ON name_grants (org_id, pattern, role)
  WHERE role IS NOT NULL;

-- A reclaimed name: unpublished from `dag_id` by an admin. It is held by the admins from then
-- on (only an admin's or a grantee's deploy publishes it), and that DAG's cutovers and
-- rollbacks skip it.
CREATE TABLE name_reclaims (
  org_id        UUID NOT NULL REFERENCES orgs,
  name          TEXT NOT NULL CHECK (name ~ '^[a-z][a-z0-9_]{0,127}$'),
  dag_id        UUID NOT NULL REFERENCES dags,
  reclaimed_by  UUID NOT NULL REFERENCES users,
  reclaimed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (org_id, name, dag_id)
);
