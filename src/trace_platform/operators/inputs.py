"""Reading exactly what was committed: every attempt writes its own keys (see output.py), so a
reader follows the commit's location (`TaskPayload.committed`, resolved at task-fetch), never
a listing of a range's prefix, which may also hold other attempts' files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from trace_platform.contract import DatasetRef, RangeSpec, scope_key
from trace_platform.objectstore.committed import committed_parquet
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
    keys = parquet_keys(ctx, locations)
    for n, key in enumerate(keys):
        ctx.store.get_file(key, dest / f"{n:06d}-{Path(key).name}")
    return len(keys)


def parquet_keys(ctx: OperatorContext, locations: list[str]) -> list[str]:
    """The Parquet committed at `locations`, in order (read through the task's scoped store; a
    location's manifest, where it has one, says which)."""
    return [key for location in locations for key in committed_parquet(ctx.store, location)]


def read_frame(ctx: OperatorContext, locations: list[str], name: str = "input") -> Any | None:
    """The Parquet under `locations` as one Spark DataFrame, or None when there is none.

    On a cluster (Spark Connect) the executors read the objects by key themselves
    (`trace_platform.spark.objects`); in a local Spark, whose executors share the sandbox and
    hold no store access, the files are first fetched through the scoped store into
    `workdir/name`."""
    if ctx.spark_remote is not None:
        from trace_platform.spark.objects import NAME

        keys = parquet_keys(ctx, locations)
        if not keys:
            return None
        return ctx.spark.read.format(NAME).option("keys", json.dumps(keys)).load()
    local = ctx.workdir / name
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    if not fetch_parquet(ctx, locations, local):
        return None
    return ctx.spark.read.parquet(str(local))
