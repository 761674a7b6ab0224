"""Exported history as datasets of the Query Service, and what a lookup of exported work says.

Each table retention exports is a dataset named `_history_<table>` (`_history_task_registry`,
`_history_task_attempts`, `_history_events`, `_history_task_status`, ...): no registered name
can start with '_', so none is shadowed. Only org admins may read them, and each org's admins
read their own org's rows only: retention writes one file per org (retention/export.py) and a
pin here holds the caller's org's files alone, so no query can reach another org's history.
Anyone else asking for one is answered as for a dataset that does not exist."""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg_pool import ConnectionPool

from trace_platform.identity import Actor
from trace_platform.objectstore import ObjectStore
from trace_platform.query.pins import Pin
from trace_platform.retention.units import date_of
from trace_platform.store.retention import RetentionStore

PREFIX = "_history_"
# The tables retention exports today (any later start_day-partitioned table joins them by its
# own exports).
TABLES = frozenset(
    {"task_registry", "task_attempts", "task_retries", "events", "task_status", "audit_log"}
)
# Those a run's rows go to (the audit log is the org's, not a run's).
RUN_TABLES = ("task_registry", "task_status", "task_attempts", "task_retries", "events")
_NS = uuid.UUID("0f6f0c1e-5b7a-4d52-9a43-7e1f3c2b9d10")  # names the history pins' uuids


def is_history(name: str) -> bool:
    return name.startswith(PREFIX)


def _exported(pool: ConnectionPool, actor: Actor) -> set[str]:
    with pool.connection() as conn:
        rows = RetentionStore(conn).history_parents(org_id=actor.org_id).fetchall()
    return {PREFIX + r["parent"] for r in rows}


def readable(pool: ConnectionPool, actor: Actor) -> list[str]:
    """The history datasets with rows `actor` may query: an org admin's org's; none otherwise."""
    return sorted(_exported(pool, actor)) if actor.is_admin else []


def hidden(pool: ConnectionPool, actor: Actor, names: list[str]) -> list[str]:
    """Of these history names, the ones `actor` may not read or that name no table (an org
    admin may name a table with nothing exported yet: its answer is 'no data yet')."""
    if not names:
        return []
    known = (_exported(pool, actor) | {PREFIX + t for t in TABLES}) if actor.is_admin else set()
    return [n for n in names if n not in known]


def pin(pool: ConnectionPool, store: ObjectStore, actor: Actor, names: list[str]) -> dict[str, Pin]:
    """Each history dataset at the exports made so far: the files of the caller's org only."""
    pins: dict[str, Pin] = {}
    with pool.connection() as conn:
        for name in names:
            rows = (
                RetentionStore(conn)
                .history_files(parent=name.removeprefix(PREFIX), org_id=actor.org_id)
                .fetchall()
            )
            exports = ",".join(sorted({str(r["export_id"]) for r in rows}))
            pins[name] = Pin(
                name,
                uuid.uuid5(_NS, f"{actor.org_id}/{name}"),
                uuid.uuid5(_NS, exports) if exports else UUID(int=0),
                "parquet",
                tuple(store.uri(r["key"]) for r in rows),
            )
    return pins


def exported_run(conn: Connection[Any], fire_day: int) -> str | None:
    """What to say of a run begun on `fire_day` when retention dropped that month, else None."""
    row = RetentionStore(conn).dropped_registry_at(day=fire_day).fetchone()
    if row is None:
        return None
    month = f"{date_of(row['lo_day']):%Y-%m-%d}..{date_of(row['hi_day'] - 1):%Y-%m-%d}"
    where = (
        f"exported to {row['prefix']} and queryable by org admins as the history datasets "
        + ", ".join(PREFIX + t for t in RUN_TABLES)
        if row["prefix"]
        else "dropped without export"
    )
    return (
        f"its tasks (started {month}) left Postgres on {row['dropped_at']:%Y-%m-%d} by retention: "
        f"{where}"
    )


def exported_note(conn: Connection[Any]) -> str:
    """For a task not found: says that tasks before a day were exported (the same text whatever
    the task, so it tells nothing of whether it existed)."""
    row = RetentionStore(conn).dropped_registry_until().fetchone()
    if row is None or row["hi_day"] is None:
        return ""
    return (
        f" (tasks started before {date_of(row['hi_day']):%Y-%m-%d} left Postgres by retention; "
        f"org admins query them as {PREFIX}task_registry and {PREFIX}task_status)"
    )
