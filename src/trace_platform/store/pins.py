"""The state store's `query` calls (`db/sql/query.sql`)."""

from __future__ import annotations

from uuid import UUID

from psycopg import Cursor

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("query")


class PinStore(Calls):
    """The calls of `db/sql/query.sql`, each with its parameters by name and type, on the
    caller's connection (inside the caller's transaction); each returns its cursor."""

    def pin_datasets(self, *, org_id: UUID, names: list[str]) -> Cursor[Row]:
        """The named datasets plus their published hot windows, each with its current version and
        that version's committed locations: one statement, so one snapshot for every pin."""
        return self._run(_Q.pin_datasets, {"org_id": org_id, "names": names})

    def readable_names(self, *, org_id: UUID) -> Cursor[Row]:
        return self._run(_Q.readable_names, {"org_id": org_id})

    def insert_pin(self, *, query_id: UUID, ttl: float) -> Cursor[Row]:
        """A query's lease on what it pins (see migration 0013): committed before it reads any
        commit."""
        return self._run(_Q.insert_pin, {"query_id": query_id, "ttl": ttl})

    def delete_pin(self, *, query_id: UUID) -> Cursor[Row]:
        return self._run(_Q.delete_pin, {"query_id": query_id})
