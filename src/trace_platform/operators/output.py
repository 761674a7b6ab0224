"""Writing an operator's output: stage locally, upload under this attempt's own keys, then the
commit and event that make it visible (attempt-fenced by the Dispatcher).

Files a commit points at are never rewritten or deleted: a retry or replay writes new keys
(`attempt_prefix`) and its commit swaps the scope's location in one statement, retiring the
old one for the collector (registry/collector.py), so a query that pinned the old files reads
them to the end. An `append` output with a `unique_key` never repeats a key: duplicates within
the frame go, and so do keys already committed by other scopes of the version overlapping this
range (the scope's own earlier commit is replaced, not added to)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import Any

from trace_platform.contract import (
    DatasetRef,
    EventIn,
    OutputCommit,
    RangeSpec,
    TaskPayload,
    scope_key,
)
from trace_platform.operators.context import OperatorContext, OperatorResult
from trace_platform.operators.inputs import fetch_parquet


def range_prefix(location: str, start: int, end: int) -> str:
    return f"{location.rstrip('/')}/range={start:010d}-{end:010d}/"


def attempt_prefix(location: str, task: TaskPayload) -> str:
    """Where one attempt writes a scope: keys no other attempt (nor a replay) ever writes."""
    return f"{location.rstrip('/')}/t={task.task_id}.{task.attempt}/"


def _append_only(ctx: OperatorContext, frame: Any, out: DatasetRef, rng: RangeSpec | None) -> Any:
    """The frame without keys repeated in it or committed by overlapping scopes of the version
    (as committed when this attempt was fetched: `TaskPayload.committed`)."""
    key = list(out.unique_key or ())
    frame = frame.dropDuplicates(key)
    own = scope_key(None, rng)
    others = [
        c.location
        for c in ctx.task.committed
        if c.dataset_version == out.dataset_version and c.scope != own
    ]
    local = ctx.workdir / "committed"
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    if not others or not fetch_parquet(ctx, others, local):
        return frame
    seen = ctx.spark.read.parquet(str(local)).select(*key).distinct()
    return frame.join(seen, on=key, how="left_anti")


def publish_frame(
    ctx: OperatorContext,
    frame: Any,
    rng: RangeSpec | None = None,
    order: Sequence[str] = (),
) -> OperatorResult:
    """A Spark DataFrame into output 0: one range of it, or (no range) the whole version;
    `order` sorts the rows written."""
    out = ctx.task.outputs[0]
    assert out.location is not None
    if out.update_strategy == "append" and out.unique_key:
        frame = _append_only(ctx, frame, out, rng)
    if order:
        frame = frame.orderBy(*order)
    stage = ctx.workdir / "output"
    shutil.rmtree(stage, ignore_errors=True)
    frame.coalesce(1).write.mode("overwrite").parquet(str(stage))
    store = ctx.store
    scope = range_prefix(out.location, rng.start, rng.end) if rng else out.location
    prefix = attempt_prefix(scope, ctx.task)
    size = 0
    for i, f in enumerate(sorted(stage.glob("*.parquet"))):
        size += f.stat().st_size
        store.put_file(f"{prefix}part-{i:05d}.parquet", f)
    rows = int(ctx.spark.read.parquet(str(stage)).count())
    identity: dict[str, Any] = {"range": rng} if rng else {"partition_key": "all"}
    return OperatorResult(
        events=[
            EventIn(
                dataset_uuid=out.dataset_uuid,
                payload={"rows": rows, "location": prefix},
                **identity,
            )
        ],
        outputs=[
            OutputCommit(
                dataset_uuid=out.dataset_uuid,
                dataset_version=out.dataset_version,
                range=rng,
                location=prefix,
                row_count=rows,
                byte_count=size,
            )
        ],
    )
