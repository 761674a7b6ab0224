"""Simple platform operators."""

from __future__ import annotations

import time

from pydantic import Field

from trace_platform.operators.config import OperatorConfig
from trace_platform.operators.context import OperatorContext


class SleepConfig(OperatorConfig):
    seconds: float = Field(
        default=1.0, ge=0, le=7 * 24 * 3600, description="how long the task sleeps"
    )
    step: float = Field(default=0.1, gt=0, le=3600, description="progress granularity")


def sleep(ctx: OperatorContext) -> None:
    """config: seconds (float), step (float, progress granularity)."""
    cfg = SleepConfig.from_ctx(ctx)
    seconds, step = cfg.seconds, cfg.step
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(step, left))
        ctx.progress(done=round(1 - max(0.0, end - time.monotonic()) / seconds, 3))
