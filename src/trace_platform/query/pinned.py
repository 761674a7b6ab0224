"""The platform's own readers (saved queries, `trace verify`, the demo's report) pin the DAG
that must produce what they read: a name another DAG publishes (a squatter's, issue 38) is
refused, naming the expected producer, instead of its numbers being read as the platform's.

The check runs on the plan's pins (dataset uuids, whose producer never changes), after the
plan pinned them and before anything runs: no window for the name to move in between."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from trace_platform.errors import Conflict
from trace_platform.identity import Actor
from trace_platform.query import saved
from trace_platform.query.pins import Pin
from trace_platform.query.service import QueryService, Result
from trace_platform.store.names import NameStore


def _wrong(found: dict[str, str], producer: str, what: str) -> Conflict:
    name, by = sorted(found.items())[0]
    return Conflict(
        "wrong_producer",
        f"{what} reads '{name}' from DAG '{producer}', but DAG '{by}' publishes it: refusing to "
        f"read another DAG's numbers as the platform's (an admin can take the name back: "
        f"trace names reclaim {name})",
        expected_producer=producer,
        published_by=found,
    )


def check_pins(qs: QueryService, pins: dict[str, Pin], producer: str, what: str) -> None:
    """Every pinned dataset (and hot window) is produced by DAG `producer`, else Conflict (409)."""
    uuids: dict[UUID, str] = {}
    for p in pins.values():
        uuids[p.dataset_uuid] = p.name
        if p.hot is not None:
            uuids[p.hot.dataset_uuid] = p.hot.name
    if not uuids:
        return
    with qs.pool.connection() as conn:
        rows = NameStore(conn).producers_of(uuids=list(uuids)).fetchall()
    found = {
        uuids[r["dataset_uuid"]]: r["producer_dag"] for r in rows if r["producer_dag"] != producer
    }
    if found:
        raise _wrong(found, producer, what)


def query(
    qs: QueryService,
    actor: Actor,
    sql: str,
    params: dict[str, Any] | None,
    *,
    producer: str,
    what: str,
    **kw: Any,
) -> Result:
    """`qs.query`, refusing (409) a dataset not produced by DAG `producer`."""
    plan = qs.plan(actor, sql, params)
    try:
        check_pins(qs, plan.pins, producer, what)
    except BaseException:
        qs.release(plan)
        raise
    return qs.execute(plan, **kw)


def saved_query(
    qs: QueryService, actor: Actor, name: str, params: dict[str, Any], **kw: Any
) -> Result:
    """Saved query `name` (query/saved.py) with its parameters, pinned to its producer."""
    q = saved.load(name)
    what = f"saved query '{name}'"
    return query(qs, actor, q.sql, q.params(params), producer=q.producer, what=what, **kw)


def export(
    qs: QueryService,
    actor: Actor,
    sql: str,
    params: dict[str, Any] | None,
    fmt: str,
    *,
    producer: str,
    what: str,
) -> dict[str, Any]:
    """`qs.export`, checked on a plan of its own just before (the export plans inside the
    Query Service): the name moving in between needs an admin, as every reserved name does."""
    plan = qs.plan(actor, sql, params)
    try:
        check_pins(qs, plan.pins, producer, what)
    finally:
        qs.release(plan)
    return qs.export(actor, sql, params, fmt)
