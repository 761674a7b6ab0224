"""Writing an operator's output: stage locally, replace this scope's files in the object store,
then the commit and event that make it visible (attempt-fenced by the Dispatcher)."""

from __future__ import annotations

import shutil
from typing import Any

from trace_platform.contract import EventIn, OutputCommit, RangeSpec
from trace_platform.objectstore import delete_prefix
from trace_platform.operators.context import OperatorContext, OperatorResult


def range_prefix(location: str, start: int, end: int) -> str:
    return f"{location.rstrip('/')}/range={start:010d}-{end:010d}/"


def publish_frame(ctx: OperatorContext, frame: Any, rng: RangeSpec | None = None) -> OperatorResult:
    """A Spark DataFrame into output 0: one range of it, or (no range) the whole version."""
    out = ctx.task.outputs[0]
    assert out.location is not None
    stage = ctx.workdir / "output"
    shutil.rmtree(stage, ignore_errors=True)
    frame.coalesce(1).write.mode("overwrite").parquet(str(stage))
    store = ctx.store
    prefix = range_prefix(out.location, rng.start, rng.end) if rng else out.location
    delete_prefix(store, prefix)  # a re-run replaces its own files, never adds to them
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
