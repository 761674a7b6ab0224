"""The state store's `names` calls (`db/sql/names.sql`): grants of published names, reclaimed
names, and the producing DAG of published datasets."""

from __future__ import annotations

from uuid import UUID

from psycopg import Cursor

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("names")


class NameStore(Calls):
    """The calls of `db/sql/names.sql`, each with its parameters by name and type, on the
    caller's connection (inside the caller's transaction); each returns its cursor."""

    def grants_for(
        self, *, org_id: UUID, name: str, user_id: UUID, roles: list[str]
    ) -> Cursor[Row]:
        return self._run(
            _Q.grants_for, {"org_id": org_id, "name": name, "user_id": user_id, "roles": roles}
        )

    def org_has_grants(self, *, org_id: UUID) -> Cursor[Row]:
        return self._run(_Q.org_has_grants, {"org_id": org_id})

    def is_reclaimed(self, *, org_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.is_reclaimed, {"org_id": org_id, "name": name})

    def reclaimed_from_dag(self, *, dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.reclaimed_from_dag, {"dag_id": dag_id})

    def insert_grant(
        self,
        *,
        org_id: UUID,
        pattern: str,
        user_id: UUID | None,
        role: str | None,
        granted_by: UUID,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_grant,
            {
                "org_id": org_id,
                "pattern": pattern,
                "user_id": user_id,
                "role": role,
                "granted_by": granted_by,
            },
        )

    def delete_grant(
        self, *, org_id: UUID, pattern: str, user_id: UUID | None, role: str | None
    ) -> Cursor[Row]:
        return self._run(
            _Q.delete_grant,
            {"org_id": org_id, "pattern": pattern, "user_id": user_id, "role": role},
        )

    def list_grants(self, *, org_id: UUID) -> Cursor[Row]:
        return self._run(_Q.list_grants, {"org_id": org_id})

    def list_reclaims(self, *, org_id: UUID) -> Cursor[Row]:
        return self._run(_Q.list_reclaims, {"org_id": org_id})

    def unpublish_name(self, *, org_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.unpublish_name, {"org_id": org_id, "name": name})

    def unlink_hot_windows_of(self, *, dataset_uuid: UUID) -> Cursor[Row]:
        return self._run(_Q.unlink_hot_windows_of, {"dataset_uuid": dataset_uuid})

    def insert_reclaim(
        self, *, org_id: UUID, name: str, dag_id: UUID, reclaimed_by: UUID
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_reclaim,
            {"org_id": org_id, "name": name, "dag_id": dag_id, "reclaimed_by": reclaimed_by},
        )

    def delete_reclaim(self, *, dag_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.delete_reclaim, {"dag_id": dag_id, "name": name})

    def producers_of(self, *, uuids: list[UUID]) -> Cursor[Row]:
        return self._run(_Q.producers_of, {"uuids": uuids})

    def org_admins(self, *, org_id: UUID) -> Cursor[Row]:
        return self._run(_Q.org_admins, {"org_id": org_id})
