"""The worker registry's wire models (`/internal/workers/*`, `GET /v1/workers`): what a worker
says of itself when it registers, its beats, and a registered worker as listed. Every field is
bounded: a body is a few hundred bytes, whatever a caller sends."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from trace_platform.config import HOST_NAME

# How many of its own beat intervals a worker may stay silent before the reaper declares it dead.
DEAD_AFTER_BEATS = 3
# host:pid:nonce (worker/membership.py makes it; the host part is TRACE_WORKER_HOST's rule).
WORKER_ID = HOST_NAME[:-1] + r":[0-9]{1,10}:[0-9a-f]{4,32}$"

WorkerId = Annotated[str, Field(pattern=WORKER_ID, max_length=300)]
WorkerState = Literal["alive", "stopped", "dead"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkerRegistration(_Body):
    """`POST /internal/workers/register`: sent on start (and again after the API lost it)."""

    worker_id: WorkerId
    host: Annotated[str, Field(pattern=HOST_NAME, max_length=253)]
    pid: Annotated[int, Field(ge=1, le=2**31 - 1)]
    version: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}$")]
    slots: Annotated[int, Field(ge=1, le=4096)]  # tasks it runs at once
    beat_seconds: Annotated[float, Field(ge=0.05, le=3600)]


class WorkerRef(_Body):
    """`POST /internal/workers/beat` and `/internal/workers/stop`."""

    worker_id: WorkerId


class WorkerBeat(BaseModel):
    """The answer to a registration, a beat or a stop."""

    worker_id: str
    state: WorkerState
    beat_seconds: float
    dead_after_seconds: float  # silent this long, it is declared dead


class WorkerView(BaseModel):
    """One registered worker, as `trace workers list` and `GET /v1/workers` show it."""

    worker_id: str
    host: str
    pid: int
    version: str
    slots: int
    beat_seconds: float
    state: WorkerState
    started_at: datetime
    last_beat: datetime
    beat_age_seconds: float
    running: int  # its running tasks of the caller's org (another org's are not its to see)
    ended_at: datetime | None = None
    ended_reason: str | None = None
