"""Dataset names to pinned, readable locations: `dataset_name → dataset_uuid → backend,
location` at the current version, resolved once, in one snapshot, at query start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg_pool import ConnectionPool

from trace_platform.db.queries import Queries
from trace_platform.dispatcher.errors import NotFound
from trace_platform.identity import Actor, can_read_row
from trace_platform.objectstore import ObjectStore, list_all

_Q = Queries("query")


@dataclass(frozen=True)
class Pin:
    """One dataset at the version a query reads for its whole run."""

    name: str
    dataset_uuid: UUID
    version: UUID
    backend: str
    files: tuple[str, ...] = ()  # Parquet: the committed files' URIs
    table: str | None = None  # Postgres: "schema.table" of the version, if it exists yet
    hot: Pin | None = None  # the dataset's hot window, served together with it
    hot_key: str | None = None

    @property
    def empty(self) -> bool:
        return not self.files and self.table is None

    def to_json(self) -> dict[str, Any]:
        """For the query worker (which gets the pinned plan, not the registry)."""
        return {
            "name": self.name,
            "dataset_uuid": str(self.dataset_uuid),
            "version": str(self.version),
            "backend": self.backend,
            "files": list(self.files),
            "table": self.table,
            "hot": self.hot.to_json() if self.hot is not None else None,
            "hot_key": self.hot_key,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Pin:
        return cls(
            name=str(d["name"]),
            dataset_uuid=UUID(d["dataset_uuid"]),
            version=UUID(d["version"]),
            backend=str(d["backend"]),
            files=tuple(str(f) for f in d["files"]),
            table=d["table"],
            hot=cls.from_json(d["hot"]) if d["hot"] is not None else None,
            hot_key=d["hot_key"],
        )


def readable_names(pool: ConnectionPool, actor: Actor) -> list[str]:
    with pool.connection() as conn:
        rows = conn.execute(_Q.readable_names, {"org_id": actor.org_id}).fetchall()
    return [r["dataset_name"] for r in rows if can_read_row(actor, r)]


def pin(pool: ConnectionPool, store: ObjectStore, actor: Actor, names: set[str]) -> dict[str, Pin]:
    """Pins every named dataset (and its hot window), checking read_roles; nothing is read
    before every name passes. A name that does not exist and a name the caller may not read
    answer alike (404, same message, the name in `detail.unknown` either way), like
    `ControlPlane.show_dataset`: a query cannot tell whether an unreadable dataset exists.
    One statement reads every pin, so all of them come from one snapshot."""
    wanted = sorted(names)
    with pool.connection() as conn:
        rows = conn.execute(_Q.pin_datasets, {"org_id": actor.org_id, "names": wanted}).fetchall()
    by_name = {r["dataset_name"]: r for r in rows}
    hidden = [n for n in wanted if n not in by_name or not can_read_row(actor, by_name[n])]
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
            store.uri(o.key)
            for prefix in row["commit_locations"]
            for o in list_all(store, prefix)
            if o.key.endswith(".parquet")
        )
        return Pin(row["dataset_name"], row["dataset_uuid"], version, "parquet", tuple(files))

    pins: dict[str, Pin] = {}
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
