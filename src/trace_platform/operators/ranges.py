"""range_splitter: a backfill request -> fixed-size, deterministic range manifests;
chain_tip: the same from a chain's head; range_aggregator: ranges back into fixed windows.

Ranges are half-open [start, end). The request comes from the config, overridden by the
trigger's run config (`from_block`, `to_block` inclusive, `chunk_size`)."""

from __future__ import annotations

from typing import Any

from trace_platform.dispatcher.models import EventIn, RangeSpec
from trace_platform.operators.context import OperatorContext, OperatorResult, PermanentError


def split(first: int, last: int, size: int) -> list[tuple[int, int]]:
    """Chunks aligned to multiples of `size`, so re-running a backfill hits the same ranges."""
    out = []
    start = first
    while start <= last:
        end = min((start // size + 1) * size, last + 1)
        out.append((start, end))
        start = end
    return out


def manifests(ctx: OperatorContext, spans: list[tuple[int, int]], **extra: Any) -> list[EventIn]:
    """Range manifest events on output 0, with the explicit range fields downstream reads."""
    if not ctx.task.outputs:
        raise PermanentError(f"{ctx.task.operator} needs one output to emit its manifests on")
    dataset = ctx.task.outputs[0].dataset_uuid
    return [
        EventIn(
            dataset_uuid=dataset,
            range=RangeSpec(start=s, end=e),
            payload={"partition_key": f"{s:010d}-{e:010d}", "start": s, "end": e, **extra},
        )
        for s, e in spans
    ]


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
    events = manifests(ctx, split(first, last, size))
    ctx.progress(ranges=len(events))
    return events


def chain_tip(ctx: OperatorContext) -> OperatorResult:
    """Tip following: each run emits the complete, aligned ranges between where the last run
    stopped (durable operator state) and the chain head minus `safety_blocks` (Monad's `latest`
    is speculative; `finalized` is used when the node has it). Config: `chunk_size`,
    `start_block`, `safety_blocks`, `rpc_url` (else the slot's RPC_URL)."""
    from trace_platform.devnet.rpc import Rpc, RpcError

    size = int(ctx.config.get("chunk_size", 100))
    safety = int(ctx.config.get("safety_blocks", 3))
    rpc_url = ctx.config.get("rpc_url") or ctx.env.get("RPC_URL")
    if not rpc_url:
        raise PermanentError("no RPC: set config.rpc_url or RPC_URL in the worker pool slot")
    state = ctx.task.operator_state or {}
    start = int(state.get("next_block", ctx.config.get("start_block", 0)))
    rpc = Rpc(rpc_url)
    try:
        try:
            head = int(rpc.call("eth_getBlockByNumber", "finalized", False)["number"], 16)
        except (RpcError, TypeError, KeyError):
            head = rpc.block_number()
    finally:
        rpc.close()
    safe = head - safety
    stop = ((safe + 1) // size) * size  # only whole chunks: the same ranges a backfill makes
    events = manifests(ctx, split(start, stop - 1, size) if stop > start else [], head=head)
    ctx.progress(head=head, emitted=len(events))
    return OperatorResult(events=events, state={"next_block": max(start, stop), "head": head})


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Half-open intervals, sorted and merged where they touch or overlap."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def covers(intervals: list[tuple[int, int]], start: int, end: int) -> bool:
    return any(s <= start and end <= e for s, e in intervals)


MAX_WINDOWS_PER_RANGE = 1000  # one completion carries at most this many events


def completed_windows(
    covered: list[tuple[int, int]], new: tuple[int, int], size: int, origin: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Adds range `new` to the covered set; returns the new set and the windows
    [origin + k*size, origin + (k+1)*size) that this range completed (each exactly once)."""
    before = merge(covered)
    s, e = new
    if e <= s:
        return before, []
    after = merge([*before, new])
    # Only windows that overlap `new` and lie inside the merged interval now holding it can
    # have completed: the first starting at or after lo (and not before the origin), up to the
    # last ending at or before hi.
    lo, hi = next((a, b) for a, b in after if a <= s and e <= b)
    first = max(0, -(-(lo - origin) // size), (s - origin) // size)
    last = min((hi - origin) // size, -(-(e - origin) // size))
    if last - first > MAX_WINDOWS_PER_RANGE:
        raise PermanentError(
            f"range [{s}, {e}) completes {last - first} windows of {size}: more than "
            f"{MAX_WINDOWS_PER_RANGE} manifests at once; use a larger config.size"
        )
    done = []
    for k in range(first, last):
        w = (origin + k * size, origin + (k + 1) * size)
        if not covers(before, *w):
            done.append(w)
    return after, done


def range_aggregator(ctx: OperatorContext) -> OperatorResult:
    """The inverse of range_splitter: collects input ranges (in any order, duplicates
    included) in durable state and emits one manifest per fixed window
    [origin + k*size, origin + (k+1)*size) once every block of it has arrived. Config: `size`,
    `origin` (default 0). The state is saved by compare-and-set with the completion, so
    concurrent runs cannot lose a range."""
    rng = (ctx.task.input_event or {}).get("range")
    if not rng:
        raise PermanentError("range_aggregator needs range events from its input job")
    try:
        size, origin = int(ctx.config["size"]), int(ctx.config.get("origin", 0))
    except (KeyError, TypeError, ValueError):
        raise PermanentError("range_aggregator needs an integer config.size (and origin)") from None
    if size <= 0:
        raise PermanentError("range_aggregator config.size must be positive")
    state = ctx.task.operator_state or {}
    covered = [(int(a), int(b)) for a, b in state.get("covered", [])]
    covered, windows = completed_windows(
        covered, (int(rng["start"]), int(rng["end"])), size, origin
    )
    events = manifests(ctx, windows)
    ctx.progress(windows=len(events))
    return OperatorResult(events=events, state={"covered": [list(c) for c in covered]})
