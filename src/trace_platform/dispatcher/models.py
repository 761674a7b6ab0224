"""The dispatcher's own read models (a task as `trace runs show` and the API show it).

The wire contract (task specs, claims, lease refs, events, output commits, the task payload)
lives in `trace_platform.contract`."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from trace_platform.contract import TaskStatus


class AttemptView(BaseModel):
    attempt: int
    worker_id: str | None
    started_at: datetime
    finished_at: datetime | None
    outcome: str
    error: str | None


class TaskView(BaseModel):
    task_id: UUID
    run_id: UUID | None
    start_day: int
    org_id: UUID
    dag_id: UUID | None
    dag_version: int | None
    job: str
    operator: str
    runtime: str
    config: dict[str, Any]
    parent_task_id: UUID | None
    status: TaskStatus
    attempt: int
    max_attempts: int
    timeout_seconds: int
    cancel_requested: bool
    lease_until: datetime | None
    heartbeat_at: datetime | None
    next_attempt_at: datetime | None
    last_error: str | None
    created_at: datetime
    finished_at: datetime | None
    attempts: list[AttemptView]
    events: int


class CancelResponse(BaseModel):
    task_id: UUID
    status: TaskStatus
    cancel_requested: bool
