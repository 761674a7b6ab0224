"""The state store's `identity` calls (`db/sql/identity.sql`)."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from psycopg import Cursor

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("identity")


class IdentityStore(Calls):
    """The calls of `db/sql/identity.sql`, each with its parameters by name and type, on the
    caller's connection (inside the caller's transaction); each returns its cursor."""

    def ensure_org(self, *, org_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.ensure_org, {"org_id": org_id, "name": name})

    def ensure_user(
        self,
        *,
        user_id: UUID,
        org_id: UUID,
        name: str,
        is_admin: bool,
        roles: list[str],
    ) -> Cursor[Row]:
        return self._run(
            _Q.ensure_user,
            {
                "user_id": user_id,
                "org_id": org_id,
                "name": name,
                "is_admin": is_admin,
                "roles": roles,
            },
        )

    def user_by_name(self, *, org_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.user_by_name, {"org_id": org_id, "name": name})

    def insert_key(
        self,
        *,
        key_id: UUID,
        user_id: UUID,
        key_hash: str,
        prefix: str,
        name: str | None = None,
        expires_at: datetime | None = None,
        created_by: UUID | None = None,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_key,
            {
                "key_id": key_id,
                "user_id": user_id,
                "key_hash": key_hash,
                "prefix": prefix,
                "name": name,
                "expires_at": expires_at,
                "created_by": created_by,
            },
        )

    def user_has_key(self, *, user_id: UUID) -> Cursor[Row]:
        return self._run(_Q.user_has_key, {"user_id": user_id})

    def authenticate(self, *, key_hash: str) -> Cursor[Row]:
        return self._run(_Q.authenticate, {"key_hash": key_hash})

    def touch_key(self, *, key_id: UUID, every: float) -> Cursor[Row]:
        return self._run(_Q.touch_key, {"key_id": key_id, "every": every})

    def set_roles(
        self,
        *,
        roles: list[str],
        is_admin: bool,
        org_id: UUID,
        name: str,
    ) -> Cursor[Row]:
        return self._run(
            _Q.set_roles, {"roles": roles, "is_admin": is_admin, "org_id": org_id, "name": name}
        )

    def lock_bootstrap(self) -> Cursor[Row]:
        """One first start at a time: concurrent processes of a new install wait, then find
        the admin."""
        return self._run(_Q.lock_bootstrap)

    def lock_org(self, *, org_id: UUID) -> Cursor[Row]:
        return self._run(_Q.lock_org, {"org_id": org_id})

    def list_users(self, *, org_id: UUID, include_removed: bool) -> Cursor[Row]:
        return self._run(_Q.list_users, {"org_id": org_id, "include_removed": include_removed})

    def other_admins(self, *, org_id: UUID, user_id: UUID) -> Cursor[Row]:
        return self._run(_Q.other_admins, {"org_id": org_id, "user_id": user_id})

    def remove_user(self, *, org_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.remove_user, {"org_id": org_id, "name": name})

    def revoke_user_keys(self, *, user_id: UUID) -> Cursor[Row]:
        return self._run(_Q.revoke_user_keys, {"user_id": user_id})

    def list_keys(self, *, org_id: UUID, user_name: str | None, include_ended: bool) -> Cursor[Row]:
        return self._run(
            _Q.list_keys,
            {"org_id": org_id, "user_name": user_name, "include_ended": include_ended},
        )

    def key_for_update(self, *, key_id: UUID, org_id: UUID) -> Cursor[Row]:
        return self._run(_Q.key_for_update, {"key_id": key_id, "org_id": org_id})

    def revoke_key(self, *, key_id: UUID, grace: float) -> Cursor[Row]:
        return self._run(_Q.revoke_key, {"key_id": key_id, "grace": grace})

    def admin_keys_left(self, *, org_id: UUID) -> Cursor[Row]:
        return self._run(_Q.admin_keys_left, {"org_id": org_id})
