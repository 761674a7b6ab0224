"""Postgres data reads of the org's `alert_events` (a buffered dataset's table) for the trusted
router (`alert_route`), on the sink's login."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg import Connection, sql

COLUMNS = ("dag_id", "job", "rule", "dedupe_key", "severity", "event_time", "payload")


def alert_events(
    conn: Connection[Any], table_name: str, org_id: UUID, record_id: UUID | None
) -> list[dict[str, Any]]:
    """The org's alerts a batch (`record_id`) added, or all of them (None), oldest first."""
    schema, _, table = table_name.partition(".")
    query = sql.SQL(
        "SELECT {cols} FROM {table} WHERE org_id = %(org)s"
        " AND (%(record)s::uuid IS NULL OR record_id = %(record)s::uuid)"
        " ORDER BY event_time, rule, dedupe_key"
    ).format(
        cols=sql.SQL(", ").join(sql.Identifier(c) for c in COLUMNS),
        table=sql.Identifier(schema, table),
    )
    with conn.cursor() as cur:
        cur.execute(query, {"org": org_id, "record": record_id})
        names = [d.name for d in cur.description or []]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
