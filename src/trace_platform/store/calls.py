"""What every named-SQL group's calls share: the caller's connection (so each call runs inside
the caller's transaction) and one way to run a query."""

from __future__ import annotations

from typing import Any

from psycopg import Connection, Cursor

Row = dict[str, Any]


class Calls:
    def __init__(self, conn: Connection[Any]) -> None:
        self.conn = conn

    def _run(self, query: str, params: dict[str, Any] | None = None) -> Cursor[Row]:
        return self.conn.execute(query, params)
