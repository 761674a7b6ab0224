"""Simple platform operators."""

from __future__ import annotations

import time

from trace_platform.operators.context import OperatorContext


def sleep(ctx: OperatorContext) -> None:
    """config: seconds (float), step (float, progress granularity)."""
    seconds = float(ctx.config.get("seconds", 1.0))
    step = float(ctx.config.get("step", 0.1))
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(step, left))
        ctx.progress(done=round(1 - max(0.0, end - time.monotonic()) / seconds, 3))
