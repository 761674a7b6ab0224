"""Dataset names to pinned, readable locations: `dataset_name → dataset_uuid → backend,
location` at the current version, resolved once, in one snapshot, at query start, under a
lease (`query_pins`) that keeps the files it pinned from the collector until the query ends."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg_pool import ConnectionPool

from trace_platform.errors import NotFound
from trace_platform.identity import Actor, can_read_row
from trace_platform.objectstore import ObjectStore
from trace_platform.objectstore.committed import committed_parquet
from trace_platform.query.pins import Pin
from trace_platform.retention import history
from trace_platform.store.pins import PinStore


def readable_names(pool: ConnectionPool, actor: Actor) -> list[str]:
    with pool.connection() as conn:
        rows = PinStore(conn).readable_names(org_id=actor.org_id).fetchall()
    return [r["dataset_name"] for r in rows if can_read_row(actor, r)] + history.readable(
        pool, actor
    )


def lease(pool: ConnectionPool, query_id: UUID, ttl_seconds: float) -> None:
    """Registers a running query before it pins anything (its own transaction, committed first):
    while it lives, the collector deletes no location it may have pinned."""
    with pool.connection() as conn:
        PinStore(conn).insert_pin(query_id=query_id, ttl=ttl_seconds)


def release(pool: ConnectionPool, query_id: UUID) -> None:
    with pool.connection() as conn:
        PinStore(conn).delete_pin(query_id=query_id)


def pin(pool: ConnectionPool, store: ObjectStore, actor: Actor, names: set[str]) -> dict[str, Pin]:
    """Pins every named dataset (and its hot window), checking read_roles; nothing is read
    before every name passes. A name that does not exist and a name the caller may not read
    answer alike (404, same message, the name in `detail.unknown` either way), like
    `ControlPlane.show_dataset`: a query cannot tell whether an unreadable dataset exists.
    One statement reads every pin, so all of them come from one snapshot."""
    past = sorted(n for n in names if history.is_history(n))  # exported task history
    wanted = sorted(n for n in names if not history.is_history(n))
    with pool.connection() as conn:
        rows = PinStore(conn).pin_datasets(org_id=actor.org_id, names=wanted).fetchall()
    by_name = {r["dataset_name"]: r for r in rows}
    hidden = [n for n in wanted if n not in by_name or not can_read_row(actor, by_name[n])]
    hidden += history.hidden(pool, actor, past)
    if hidden:
        known = readable_names(pool, actor)
        named = ", ".join(f"'{n}'" for n in hidden)
        raise NotFound(
            f"no dataset{'s' if len(hidden) > 1 else ''} named {named} that you can read "
            f"(published datasets you can read: {', '.join(known) or 'none'})",
            unknown=hidden,
        )

    def one(row: dict[str, Any]) -> Pin:
        version = row["dataset_version"]
        if row["backend"] == "postgres":
            table = row["version_location"] if row["table_exists"] else None
            return Pin(row["dataset_name"], row["dataset_uuid"], version, "postgres", table=table)
        files = sorted(
            store.uri(key)
            for location in row["commit_locations"]
            for key in committed_parquet(store, location)
        )
        return Pin(row["dataset_name"], row["dataset_uuid"], version, "parquet", tuple(files))

    pins: dict[str, Pin] = history.pin(pool, store, actor, past)
    for name in wanted:
        row = by_name[name]
        p = one(row)
        hot = next(
            (
                r
                for r in rows
                if r["hot_window_of"] == row["dataset_uuid"] and can_read_row(actor, r)
            ),
            None,
        )
        if hot is not None:
            hp = one(hot)
            if not hp.empty:
                p = Pin(**{**p.__dict__, "hot": hp, "hot_key": hot["hot_window_key"]})
        pins[name] = p
    return pins
