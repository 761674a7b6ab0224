"""A dataset's versions: listed with what still needs each one, and purged by an admin.

Old versions stay (a rollback goes back to them) until an admin purges them; nothing purges
automatically. A purge deletes only metadata: the files and tables of the purged versions are
recorded in `retired_locations`, and the collector deletes them once no pinned query can still
be reading them."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any
from uuid import UUID

from psycopg import Connection

from trace_platform.registry import rollout
from trace_platform.store.registry import RegistryStore


def list_versions(conn: Connection[Any], dataset_uuid: UUID) -> list[dict[str, Any]]:
    """Every version of the dataset, newest first."""
    return RegistryStore(conn).versions_of_dataset(dataset_uuid=dataset_uuid).fetchall()


def keep_reasons(
    version: dict[str, Any], newest: AbstractSet[UUID], pinned: AbstractSet[UUID] = frozenset()
) -> list[str]:
    """Why a purge keeps this version (none: it goes)."""
    reasons = [
        ("current", version["current"]),
        ("pinned by unfinished tasks", version["dataset_version"] in pinned),
        ("building", version["state"] == "building"),
        ("active map", version["active_map"]),
        ("building map", version["building_map"]),
        ("newest", version["dataset_version"] in newest),
    ]
    return [name for name, holds in reasons if holds]


def purge(
    conn: Connection[Any], dataset: dict[str, Any], keep: int, *, dry_run: bool = False
) -> dict[str, Any]:
    """Purges every version of `dataset` (a registry row) but the `keep` newest complete ones,
    the current one, building ones and those the DAG's active or building version maps. Runs
    in the caller's transaction, holding the producing DAG's change lock so a cutover or
    rollback cannot swap pointers to a version being deleted, and no completion lands a commit
    on it meanwhile (one after finds it gone and lands nothing). Versions an unfinished task
    reads or writes are kept."""
    rollout.lock(conn, dataset["producer_dag_id"])
    rows = list_versions(conn, dataset["dataset_uuid"])
    pinned = {
        r["dataset_version"]
        for r in RegistryStore(conn)
        .pinned_versions(dataset_uuid=dataset["dataset_uuid"])
        .fetchall()
    }
    complete = [r["dataset_version"] for r in rows if r["state"] == "complete"]
    newest = set(complete[:keep])  # rows come newest first
    kept: list[dict[str, Any]] = []
    purged: list[dict[str, Any]] = []
    for r in rows:
        reasons = keep_reasons(r, newest, pinned)
        if reasons:
            kept.append({"dataset_version": r["dataset_version"], "reasons": reasons})
        else:
            purged.append(r)
    doomed = [r["dataset_version"] for r in purged]
    locations = RegistryStore(conn).purge_locations(versions=doomed).fetchall()
    if not dry_run:
        RegistryStore(conn).purge_retire(
            org_id=dataset["org_id"],
            backends=[loc["backend"] for loc in locations],
            locations=[loc["location"] for loc in locations],
        )
        # Children first: commits and DAG-version maps reference the version row.
        RegistryStore(conn).purge_commits(versions=doomed)
        RegistryStore(conn).purge_outputs(versions=doomed)
        RegistryStore(conn).purge_versions(versions=doomed)
    return {
        "dataset": dataset["dataset_name"],
        "keep": keep,
        "dry_run": dry_run,
        "purged": [
            {k: r[k] for k in ("dataset_version", "state", "dag_version", "created_at", "commits")}
            for r in purged
        ],
        "kept": kept,
        "commits": sum(r["commits"] for r in purged),
        "locations": locations,
        # A rollback to these DAG versions would now miss this output.
        "rollback_lost": sorted({v for r in purged for v in r["rollback_versions"]}),
    }
