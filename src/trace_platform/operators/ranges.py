"""range_splitter: a backfill request -> fixed-size, deterministic range manifests.

Ranges are half-open [start, end). The request comes from the config, overridden by the
trigger's run config (`from_block`, `to_block` inclusive, `chunk_size`)."""

from __future__ import annotations

from trace_platform.dispatcher.models import EventIn, RangeSpec
from trace_platform.operators.context import OperatorContext, PermanentError


def split(first: int, last: int, size: int) -> list[tuple[int, int]]:
    """Chunks aligned to multiples of `size`, so re-running a backfill hits the same ranges."""
    out = []
    start = first
    while start <= last:
        end = min((start // size + 1) * size, last + 1)
        out.append((start, end))
        start = end
    return out


def range_splitter(ctx: OperatorContext) -> list[EventIn]:
    cfg = {**ctx.config, **((ctx.task.input_event or {}).get("config") or {})}
    try:
        first, last, size = (
            int(cfg["from_block"]),
            int(cfg["to_block"]),
            int(cfg.get("chunk_size", 1000)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise PermanentError(
            f"range_splitter needs integer from_block, to_block (and chunk_size): {e}"
        ) from None
    if size <= 0 or last < first:
        raise PermanentError(
            f"empty or invalid range: from_block {first}, to_block {last}, chunk {size}"
        )
    if not ctx.task.outputs:
        raise PermanentError("range_splitter needs one output to emit its manifests on")
    dataset = ctx.task.outputs[0].dataset_uuid
    events = [
        EventIn(
            dataset_uuid=dataset,
            range=RangeSpec(start=s, end=e),
            payload={"partition_key": f"{s:010d}-{e:010d}", "start": s, "end": e},
        )
        for s, e in split(first, last, size)
    ]
    ctx.progress(ranges=len(events))
    return events
