"""range_splitter: a backfill request -> fixed-size, deterministic range manifests;
chain_tip: the same from a chain's head; range_aggregator: ranges back into fixed windows.

Ranges are half-open [start, end). The request comes from the config, overridden by the
trigger's run config (`from_block`, `to_block` inclusive, `chunk_size`); both are read through
`RangeSplitterConfig`, so deploy and run time apply the same rules.

One Dispatcher call carries at most `MAX_EVENTS_PER_CALL` events: a request that makes more
ranges sends the earlier ones as mid-task events (`ctx.emit`, attempt-fenced and deduplicated
by range, so a retry re-sends nothing new) and returns the last batch with the completion. A
single request makes at most `MAX_RANGES_PER_REQUEST` ranges."""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator

from trace_platform.contract import MAX_EVENTS_PER_CALL, EventIn, RangeSpec
from trace_platform.operators.config import OperatorConfig
from trace_platform.operators.context import OperatorContext, OperatorResult, PermanentError

MAX_BLOCK = 2**62  # far past any chain, well inside Postgres bigint
MAX_RANGES_PER_REQUEST = 100_000  # one run's manifests (each a mid-task call beyond the last batch)


def count_ranges(first: int, last: int, size: int) -> int:
    """How many ranges `split(first, last, size)` makes, without making them."""
    return 0 if last < first else last // size - first // size + 1


def _too_many(first: int, last: int, size: int) -> str:
    n = count_ranges(first, last, size)
    return (
        f"from_block {first} to to_block {last} in chunks of {size} makes {n:,} ranges; one "
        f"request makes at most {MAX_RANGES_PER_REQUEST:,}: use a larger chunk_size or split the "
        "request"
    )


class RangeSplitterConfig(OperatorConfig):
    """`from_block` and `to_block` (inclusive) may come from the job or from the trigger's run
    config; `chunk_size` blocks per range, aligned to its multiples."""

    from_block: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BLOCK,
        description="first block (inclusive); else the trigger's run config's",
    )
    to_block: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BLOCK,
        description="last block (inclusive); else the trigger's run config's",
    )
    chunk_size: int = Field(
        default=1000,
        ge=1,
        le=MAX_BLOCK,
        description="blocks per range, ranges aligned to its multiples",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.from_block is not None and self.to_block is not None:
            if self.to_block < self.from_block:
                raise ValueError(
                    f"to_block {self.to_block} is before from_block {self.from_block} "
                    "(both inclusive)"
                )
            if count_ranges(self.from_block, self.to_block, self.chunk_size) > (
                MAX_RANGES_PER_REQUEST
            ):
                raise ValueError(_too_many(self.from_block, self.to_block, self.chunk_size))
        return self

    def job_problems(self, inputs: int, outputs: int) -> list[tuple[str, str]]:
        if outputs < 1:
            return [("outputs", "range_splitter needs one output to emit its manifests on")]
        return []


RUN_CONFIG_KEYS = ("from_block", "to_block", "chunk_size")


class ChainTipConfig(OperatorConfig):
    chunk_size: int = Field(
        default=100, ge=1, le=MAX_BLOCK, description="blocks per range (whole, aligned chunks only)"
    )
    safety_blocks: int = Field(
        default=3,
        ge=0,
        le=1_000_000,
        description="the reorg buffer: ranges stop this far below the head",
    )
    recheck_ranges: int = Field(
        default=16,
        ge=0,
        le=1000,
        description="how many of the last emitted ranges each run re-checks against the node's block hashes",
    )
    start_block: int = Field(
        default=0, ge=0, le=MAX_BLOCK, description="where following starts on the first run"
    )
    rpc_url: str | None = Field(
        default=None, max_length=2048, description="the node (else the pool slot's `RPC_URL`)"
    )

    def job_problems(self, inputs: int, outputs: int) -> list[tuple[str, str]]:
        if outputs < 1:
            return [("outputs", "chain_tip needs one output to emit its manifests on")]
        return []


class RangeAggregatorConfig(OperatorConfig):
    """Windows [origin + k*size, origin + (k+1)*size)."""

    size: int = Field(ge=1, le=MAX_BLOCK, description="window size in blocks")
    origin: int = Field(
        default=0,
        ge=0,
        le=MAX_BLOCK,
        description="windows are `[origin + k*size, origin + (k+1)*size)`",
    )

    def job_problems(self, inputs: int, outputs: int) -> list[tuple[str, str]]:
        if outputs < 1:
            return [("outputs", "range_aggregator needs one output to emit its manifests on")]
        return []


def split(first: int, last: int, size: int) -> list[tuple[int, int]]:
    """Chunks aligned to multiples of `size`, so re-running a backfill hits the same ranges."""
    out = []
    start = first
    while start <= last:
        end = min((start // size + 1) * size, last + 1)
        out.append((start, end))
        start = end
    return out


def _dataset(ctx: OperatorContext) -> Any:
    if not ctx.task.outputs:
        raise PermanentError(f"{ctx.task.operator} needs one output to emit its manifests on")
    return ctx.task.outputs[0].dataset_uuid


def _manifest(dataset: Any, s: int, e: int, extra: dict[str, Any]) -> EventIn:
    return EventIn(
        dataset_uuid=dataset,
        range=RangeSpec(start=s, end=e),
        payload={"partition_key": f"{s:010d}-{e:010d}", "start": s, "end": e, **extra},
    )


def manifests(ctx: OperatorContext, spans: list[tuple[int, int]], **extra: Any) -> list[EventIn]:
    """Range manifest events on output 0, with the explicit range fields downstream reads."""
    dataset = _dataset(ctx)
    return [_manifest(dataset, s, e, extra) for s, e in spans]


def deliver(ctx: OperatorContext, spans: list[tuple[int, int]], **extra: Any) -> list[EventIn]:
    """The manifests of `spans`: all but the last MAX_EVENTS_PER_CALL are emitted now, one
    mid-task event each (within the per-call limit); the rest are returned, to be reported
    with the completion."""
    dataset = _dataset(ctx)
    cut = max(0, len(spans) - MAX_EVENTS_PER_CALL)
    for i, (s, e) in enumerate(spans[:cut]):
        ctx.emit(_manifest(dataset, s, e, extra))
        if i % 500 == 0:
            ctx.progress(ranges=len(spans), emitted=i + 1)
    return [_manifest(dataset, s, e, extra) for s, e in spans[cut:]]


def range_splitter(ctx: OperatorContext) -> list[EventIn]:
    run = (ctx.task.input_event or {}).get("config") or {}
    # The trigger's run config overrides the request (its other keys, such as a cron's
    # scheduled_for, are not the splitter's); the merged request passes the same model.
    override = {k: run[k] for k in RUN_CONFIG_KEYS if k in run} if isinstance(run, dict) else {}
    cfg = RangeSplitterConfig.from_ctx(ctx, {**ctx.config, **override})
    if cfg.from_block is None or cfg.to_block is None:
        missing = [k for k in ("from_block", "to_block") if getattr(cfg, k) is None]
        raise PermanentError(
            f"range_splitter config: {', '.join(missing)}: required (in the job's config or the "
            "trigger's run config)"
        )
    spans = split(cfg.from_block, cfg.to_block, cfg.chunk_size)
    events = deliver(ctx, spans)
    ctx.progress(ranges=len(spans))
    return events


def chain_tip(ctx: OperatorContext) -> OperatorResult:
    """Tip following: each run emits the complete, aligned ranges between where the last run
    stopped (durable operator state) and the chain head minus `safety_blocks` (the reorg
    buffer: Monad's `latest` is speculative; `finalized` is used when the node has it). Config:
    `chunk_size`, `start_block`, `safety_blocks`, `recheck_ranges`, `rpc_url` (else the slot's
    RPC_URL). A run emits at most MAX_RANGES_PER_REQUEST ranges; the next run goes on from
    there. Every run first re-checks the last block hash of the last `recheck_ranges` ranges it
    emitted: from the first the node no longer confirms (a reorg below the buffer), those
    ranges are emitted again, so they are re-read and everything built from them redone."""
    from trace_platform.chain import Rpc, RpcError

    cfg = ChainTipConfig.from_ctx(ctx)
    size = cfg.chunk_size
    rpc_url = cfg.rpc_url or ctx.env.get("RPC_URL")
    if not rpc_url:
        raise PermanentError("no RPC: set config.rpc_url or RPC_URL in the worker pool slot")
    state = ctx.task.operator_state or {}
    start = int(state.get("next_block", cfg.start_block))
    recent = [(int(a), int(b), str(h)) for a, b, h in state.get("recent", [])]
    with Rpc(rpc_url) as rpc:
        try:
            head = int(rpc.call("eth_getBlockByNumber", "finalized", False)["number"], 16)
        except (RpcError, TypeError, KeyError):
            head = rpc.block_number()
        gone = reorged(recent, last_hashes(rpc, [b for _, b, _ in recent]))
        stale = gone
        safe = head - cfg.safety_blocks
        # A reorged range now above the buffer (the new chain is shorter) waits for the head
        # like any new range: following the tip starts over from it.
        later = [s for s, e in stale if e > safe + 1]
        if later:
            start = min(later)
            stale = [(s, e) for s, e in stale if e <= safe + 1]
        stop = ((safe + 1) // size) * size  # only whole chunks: the same ranges a backfill makes
        if stop > start and count_ranges(start, stop - 1, size) > MAX_RANGES_PER_REQUEST:
            stop = (start // size + MAX_RANGES_PER_REQUEST) * size  # the rest on the next run
        spans = split(start, stop - 1, size) if stop > start else []
        emitted = stale + spans
        hashes = last_hashes(rpc, [e for _, e in emitted])
    events = deliver(ctx, stale, head=head, reorg=True) + deliver(ctx, spans, head=head)
    kept = [r for r in recent if (r[0], r[1]) not in set(gone)]
    recent = sorted(kept + [(s, e, h) for (s, e), h in zip(emitted, hashes, strict=True)])
    recent = recent[-cfg.recheck_ranges :] if cfg.recheck_ranges else []
    ctx.progress(head=head, emitted=len(spans), reorged=len(stale))
    return OperatorResult(
        events=events,
        state={
            "next_block": max(start, stop),
            "head": head,
            "recent": [list(r) for r in recent],
        },
    )


def last_hashes(rpc: Any, ends: list[int]) -> list[str | None]:
    """The hash of block `end - 1` for each half-open range end (None: no such block now)."""
    if not ends:
        return []
    blocks = rpc.batch([("eth_getBlockByNumber", [hex(e - 1), False]) for e in ends])
    return [b["hash"].lower() if b else None for b in blocks]


def reorged(recent: list[tuple[int, int, str]], now: list[str | None]) -> list[tuple[int, int]]:
    """The recorded ranges from the first whose last block hash the node no longer has: a
    reorg there replaced every block after it too."""
    for i, ((_, _, was), is_now) in enumerate(zip(recent, now, strict=True)):
        if was != is_now:
            return [(s, e) for s, e, _ in recent[i:]]
    return []


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


MAX_WINDOWS_PER_RANGE = MAX_EVENTS_PER_CALL  # one completion carries at most this many events


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


def invalidated_windows(
    covered: list[tuple[int, int]], rewritten: tuple[int, int], size: int, origin: int
) -> list[tuple[int, int]]:
    """The windows already complete before that overlap a rewritten range: their manifests go
    out again, so what downstream built from them is rebuilt."""
    s, e = rewritten
    if e <= s:
        return []
    first = max(0, (s - origin) // size)
    last = -(-(e - origin) // size)
    windows = [(origin + k * size, origin + (k + 1) * size) for k in range(first, last)]
    return [w for w in windows if covers(merge(covered), *w)]


def range_aggregator(ctx: OperatorContext) -> OperatorResult:
    """The inverse of range_splitter: collects input ranges (in any order, duplicates
    included) in durable state and emits one manifest per fixed window
    [origin + k*size, origin + (k+1)*size) once every block of it has arrived. Config: `size`,
    `origin` (default 0). The state is saved by compare-and-set with the completion, so
    concurrent runs cannot lose a range. A range that arrives as an invalidation (its producer
    rewrote it) re-emits the complete windows it overlaps, marked as invalidations too."""
    event = ctx.task.input_event or {}
    rng = event.get("range")
    if not rng:
        raise PermanentError("range_aggregator needs range events from its input job")
    cfg = RangeAggregatorConfig.from_ctx(ctx)
    size, origin = cfg.size, cfg.origin
    state = ctx.task.operator_state or {}
    covered = [(int(a), int(b)) for a, b in state.get("covered", [])]
    new = (int(rng["start"]), int(rng["end"]))
    stale = invalidated_windows(covered, new, size, origin) if event.get("invalidates") else []
    covered, windows = completed_windows(covered, new, size, origin)
    events = manifests(ctx, windows)
    if stale:
        events += manifests(ctx, stale, invalidates=True)
    ctx.progress(windows=len(events))
    return OperatorResult(events=events, state={"covered": [list(c) for c in covered]})
