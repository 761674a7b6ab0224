"""The state store's `demo` calls (`db/sql/demo.sql`)."""

from __future__ import annotations

from psycopg import Cursor

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("demo")

# Query Service SQL (DuckDB), not a state-store call: what a published dataset holds now.
ROWS_NOW_SQL: str = _Q.rows_now


class DemoStore(Calls):
    """The calls of `db/sql/demo.sql`, each with its parameters by name and type, on the
    caller's connection (inside the caller's transaction); each returns its cursor."""

    def current_coverage(self, *, names: list[str]) -> Cursor[Row]:
        """Per named dataset, what its current version holds: range commits, their span, rows."""
        return self._run(_Q.current_coverage, {"names": names})

    def unfinished_tasks(self, *, dag: str | None) -> Cursor[Row]:
        return self._run(_Q.unfinished_tasks, {"dag": dag})

    def raw_identities(self, *, names: list[str]) -> Cursor[Row]:
        """The ranges the raw datasets' current versions hold, with the chain each was read from."""
        return self._run(_Q.raw_identities, {"names": names})
