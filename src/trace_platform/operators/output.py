"""Writing an operator's output under this attempt's own keys (on a Spark cluster the executors
write them; a local Spark stages them in the task's workdir and uploads every part file), then
the commit and event that make it visible (attempt-fenced by the Dispatcher).

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

from trace_platform import layout
from trace_platform.contract import (
    DatasetRef,
    EventIn,
    OutputCommit,
    RangeSpec,
    TaskPayload,
    scope_key,
)
from trace_platform.layout import range_prefix
from trace_platform.objectstore import list_all
from trace_platform.operators.context import OperatorContext, OperatorError, OperatorResult
from trace_platform.operators.inputs import read_frame


def attempt_prefix(location: str, task: TaskPayload) -> str:
    """Where one attempt writes a scope: keys no other attempt (nor a replay) ever writes (the
    one prefix the Dispatcher accepts in its commit: `layout.scope_prefix`)."""
    return layout.attempt_prefix(location, task.task_id, task.attempt)


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
    seen = read_frame(ctx, others, "committed")
    if seen is None:
        return frame
    return frame.join(seen.select(*key).distinct(), on=key, how="left_anti")


def parquet_writer(frame: Any) -> Any:
    """`frame.write` as operators write Parquet: no dictionary for the amounts' limbs (u256),
    which are near-random numbers: building a dictionary for them, only to fall back to plain,
    took a fifth of the decode's CPU, and the files come out smaller without it."""
    from trace_platform.spark import u256

    writer = frame.write
    for field in frame.schema.fields:
        if u256.is_limbs(field):
            for limb in u256.FIELDS:  # the option's column path, as Parquet names the leaf
                writer = writer.option(f"parquet.enable.dictionary#{field.name}.{limb}", "false")
    return writer


def _write_local(ctx: OperatorContext, frame: Any, prefix: str) -> tuple[int, int]:
    """A local Spark (its executors share the sandbox, without store access): written to the
    task's workdir, every part file then uploaded through the scoped store."""
    stage = ctx.workdir / "output"
    shutil.rmtree(stage, ignore_errors=True)
    parquet_writer(frame).mode("overwrite").parquet(str(stage))
    parts = sorted(stage.glob("*.parquet"))
    rows = int(ctx.spark.read.parquet(str(stage)).count())
    size = 0
    for i, f in enumerate(parts):
        size += f.stat().st_size
        ctx.store.put_file(f"{prefix}part-{i:05d}.parquet", f)
    return rows, size


def _write_remote(ctx: OperatorContext, frame: Any, prefix: str) -> tuple[int, int]:
    """A Spark cluster: the executors write under `prefix` themselves (`trace_objects`); the
    job's manifest lists its files, which must be exactly the Parquet under the prefix."""
    from trace_platform.objectstore.committed import read_manifest
    from trace_platform.spark.objects import NAME

    frame.write.format(NAME).mode("append").option("prefix", prefix).save()
    files = read_manifest(ctx.store, prefix)
    # The raw listing: parquet_keys would follow the manifest being checked.
    listed = {o.key for o in list_all(ctx.store, prefix) if o.key.endswith(".parquet")}
    if listed != {f["key"] for f in files}:
        raise OperatorError(
            f"the files under {prefix} ({len(listed)}) are not the {len(files)} the Spark job "
            "committed"
        )
    return sum(int(f["rows"]) for f in files), sum(int(f["bytes"]) for f in files)


def publish_frame(
    ctx: OperatorContext,
    frame: Any,
    rng: RangeSpec | None = None,
    order: Sequence[str] = (),
) -> OperatorResult:
    """A Spark DataFrame into output 0: one range of it, or (no range) the whole version.
    `order`: the order the frame's rows already come in within each partition (so each part
    file), kept when an append-only output's filtering shuffles them."""
    out = ctx.task.outputs[0]
    assert out.location is not None
    if out.update_strategy == "append" and out.unique_key:
        frame = _append_only(ctx, frame, out, rng)
        if order:  # the filtering shuffled the rows (each file sorted, as the frame's were)
            frame = frame.sortWithinPartitions(*order)
    scope = range_prefix(out.location, rng.start, rng.end) if rng else out.location
    prefix = attempt_prefix(scope, ctx.task)
    write = _write_remote if ctx.spark_remote is not None else _write_local
    rows, size = write(ctx, frame, prefix)
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
