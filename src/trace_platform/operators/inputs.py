"""Reading exactly what was committed: every attempt writes its own keys (see output.py), so a
reader follows the commit's location (`TaskPayload.committed`, resolved at task-fetch), never
a listing of a range's prefix, which may also hold other attempts' files."""

from __future__ import annotations

from pathlib import Path

from trace_platform.contract import DatasetRef, RangeSpec, scope_key
from trace_platform.objectstore import list_all
from trace_platform.operators.context import OperatorContext


def event_scope(ctx: OperatorContext) -> str | None:
    """The scope (range or partition) the input event names, if any."""
    event = ctx.task.input_event or {}
    rng = RangeSpec(**event["range"]) if event.get("range") else None
    pk = event.get("partition_key")
    return scope_key(pk, rng) if rng is not None or pk is not None else None


def scope_location(ctx: OperatorContext, ref: DatasetRef) -> str | None:
    """Where the input event's scope of `ref` (its pinned version) is committed: as found at
    task-fetch, else as the event reported it (when that lies in the pinned version)."""
    scope = event_scope(ctx)
    if scope is None:
        return None
    for c in ctx.task.committed:
        if c.dataset_version == ref.dataset_version and c.scope == scope:
            return c.location
    event = ctx.task.input_event or {}
    location = (event.get("payload") or {}).get("location")
    if (
        event.get("dataset_uuid") == str(ref.dataset_uuid)
        and isinstance(location, str)
        and ref.location is not None
        and location.startswith(ref.location.rstrip("/") + "/")
    ):
        return location
    return None


def version_locations(ctx: OperatorContext, ref: DatasetRef) -> list[str]:
    """Every committed location of `ref`'s pinned version (for an operator that reads whole
    inputs: see WHOLE_INPUT_OPERATORS)."""
    return [c.location for c in ctx.task.committed if c.dataset_version == ref.dataset_version]


def fetch_parquet(ctx: OperatorContext, locations: list[str], dest: Path) -> int:
    """Downloads the Parquet files under `locations` into `dest` (flat, names kept unique);
    returns how many."""
    store = ctx.store
    n = 0
    for location in locations:
        for obj in list_all(store, location.rstrip("/") + "/"):
            if obj.key.endswith(".parquet"):
                store.get_file(obj.key, dest / f"{n:06d}-{Path(obj.key).name}")
                n += 1
    return n
