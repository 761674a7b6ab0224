"""The state store's `secrets` calls (`db/sql/secrets.sql`)."""

from __future__ import annotations

from uuid import UUID

from psycopg import Cursor

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("secrets")


class SecretStore(Calls):
    """The calls of `db/sql/secrets.sql`, each with its parameters by name and type, on the
    caller's connection (inside the caller's transaction); each returns its cursor."""

    def insert_secret(
        self,
        *,
        org_id: UUID,
        name: str,
        ciphertext: str,
        owner: UUID,
        use_roles: list[str],
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_secret,
            {
                "org_id": org_id,
                "name": name,
                "ciphertext": ciphertext,
                "owner": owner,
                "use_roles": use_roles,
            },
        )

    def secret_for_update(self, *, org_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.secret_for_update, {"org_id": org_id, "name": name})

    def update_secret(
        self,
        *,
        ciphertext: str,
        owner: UUID,
        use_roles: list[str],
        org_id: UUID,
        name: str,
    ) -> Cursor[Row]:
        """A NULL ciphertext or use_roles keeps the stored one. Whoever writes the value owns it (an
        admin's overwrite takes a squatted name back from whoever created it first)."""
        return self._run(
            _Q.update_secret,
            {
                "ciphertext": ciphertext,
                "owner": owner,
                "use_roles": use_roles,
                "org_id": org_id,
                "name": name,
            },
        )

    def list_secrets(self, *, org_id: UUID, name: str) -> Cursor[Row]:
        """Every secret of the org, or only the one named (NULL: all)."""
        return self._run(_Q.list_secrets, {"org_id": org_id, "name": name})

    def secrets_named(self, *, names: list[str], org_id: UUID) -> Cursor[Row]:
        """Deploy: the secrets a DAG's worker pool slots name (absent ones have a NULL org_id)."""
        return self._run(_Q.secrets_named, {"names": names, "org_id": org_id})

    def legacy_plaintext(self) -> Cursor[Row]:
        """Rows written before migration 0008, still in plaintext until sealed at start."""
        return self._run(_Q.legacy_plaintext)

    def seal_legacy(self, *, ciphertext: str, org_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.seal_legacy, {"ciphertext": ciphertext, "org_id": org_id, "name": name})
