"""The state store's `audit` calls (`db/sql/audit.sql`): the audit log."""

from __future__ import annotations

from typing import Any

from psycopg import Cursor

from trace_platform.db.queries import Queries, literal_limit
from trace_platform.store.calls import Calls, Row

_Q = Queries("audit")


class AuditStore(Calls):
    """Every call takes the query's parameters by name, as `audit.sql` spells them."""

    def insert(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.insert, p)

    def ensure_partitions(self) -> Cursor[Row]:
        return self._run(_Q.ensure_partitions)

    def list(self, *, limit: int, **p: Any) -> Cursor[Row]:
        return self._run(literal_limit(_Q.list, limit), p)
