"""Typed parameters of the state store's calls: one frozen record per call that takes more than
a key (River's `*Params` structs), so a caller cannot misspell or forget a column."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import Any
from uuid import UUID


@dataclass(frozen=True, slots=True)
class TaskKey:
    """A task's row in the day-partitioned tables."""

    task_id: UUID
    start_day: int


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task intent: its registry row (defaults already filled in) and its first status."""

    task_id: UUID
    org_id: UUID
    dag_id: UUID | None
    dag_version: int | None
    job: str
    operator: str
    runtime: str
    config: dict[str, Any]
    parent_task_id: UUID | None
    input_event_id: UUID | None
    input_event: dict[str, Any] | None
    input_versions: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    run_id: UUID | None
    worker_pool: str | None
    max_concurrency: int | None
    timeout_seconds: int
    max_attempts: int
    retry_backoff_seconds: float
    retry_backoff_max_seconds: float
    status: str = "queued"  # or 'buffered' (held until its DAG version's cutover)
    whole_job: str | None = None  # a whole-scope writer's job (it runs one at a time)


@dataclass(frozen=True, slots=True)
class Wakeup:
    """An outbox row: a message for `queue`, published after the transaction commits."""

    queue: str
    payload: str  # the encoded queue payload (JSON text)
    delay: int  # whole seconds before it is visible


@dataclass(frozen=True, slots=True)
class ClaimParams:
    task_id: UUID
    worker_id: str
    lease: float  # seconds
    pooled: bool  # claim only a task with (True) or without (False) a worker pool
    lease_token: UUID | None = None  # the claim's key (ClaimRequest.claim_id), else a new one


@dataclass(frozen=True, slots=True)
class ClaimManyParams:
    """Plain tasks (no worker pool, no input of another DAG) to lease in one statement."""

    task_ids: list[UUID]
    worker_ids: list[str]  # who claims each task (parallel to task_ids)
    lease: float  # seconds
    lease_tokens: list[UUID | None]  # each claim's key (parallel too; None: a new token)


@dataclass(frozen=True, slots=True)
class LeaseCheck:
    """The caller's claim on one attempt: a call counts only while this holds."""

    task_id: UUID
    attempt: int
    lease_token: UUID


@dataclass(frozen=True, slots=True)
class HeartbeatParams:
    task_id: UUID
    attempt: int
    lease_token: UUID
    lease: float  # seconds from now
    progress: dict[str, Any] | None  # replaces the last report; None keeps it


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    task_id: UUID
    start_day: int
    attempt: int
    outcome: str  # succeeded|failed|canceled|state_conflict|released|lease_expired|timed_out
    error: str | None


@dataclass(frozen=True, slots=True)
class PoolKey:
    dag_id: UUID
    pool: str


@dataclass(frozen=True, slots=True)
class PoolJob:
    dag_id: UUID
    pool: str
    job: str


@dataclass(frozen=True, slots=True)
class FreedSlot:
    """A slot a release freed: its pool, and the job that held it (`whole`: as a whole-scope
    writer, whose next run is then woken in any pool)."""

    pool: PoolKey
    job: str
    whole: bool


@dataclass(frozen=True, slots=True)
class SlotLeaseParams:
    dag_id: UUID
    pool: str
    job: str
    task_id: UUID
    slot_index: int
    whole: bool = False  # a whole-scope writer's (it runs one at a time across pools)


@dataclass(frozen=True, slots=True)
class StateKey:
    """A job's operator state: per (org, DAG, job), in the lineage of `dag_version`."""

    org_id: UUID
    dag_id: UUID
    dag_version: int | None
    job: str


@dataclass(frozen=True, slots=True)
class NewEvent:
    event_id: UUID
    start_day: int
    org_id: UUID
    task_id: UUID
    attempt: int
    dataset_uuid: UUID
    dedupe_key: str
    cursor: str | None
    partition_key: str | None
    range_start: int | None
    range_end: int | None
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class NewCommit:
    commit_id: UUID
    dataset_uuid: UUID
    dataset_version: UUID
    task_id: UUID
    attempt: int
    scope: str
    partition_key: str | None
    range_start: int | None
    range_end: int | None
    location: str | None
    row_count: int | None
    byte_count: int | None
    dag_version: int | None
    chain_id: int | None
    first_block_hash: str | None
    last_block_hash: str | None
    parent_hash: str | None


@dataclass(frozen=True, slots=True)
class ReadsParams:
    """Which committed scopes an attempt reads (see `committed_reads`)."""

    scoped: list[UUID]  # versions read by the event's scope
    whole: list[UUID]  # versions read whole
    appends: list[UUID]  # append outputs: their scopes overlapping the range
    own: list[UUID]  # outputs: what they already hold for the event's scope
    scope: str | None
    range_start: int | None
    range_end: int | None


@dataclass(frozen=True, slots=True)
class RetryParams:
    task_id: UUID
    error: str
    backoff: float  # seconds until it may be claimed again


@dataclass(frozen=True, slots=True)
class RunRetryParams:
    """A run's retry by hand: its failed tasks of the DAG version it fired, started between its
    fire day and today (`first_day`, `last_day`: the days its tasks' rows may be in)."""

    run_id: UUID
    dag_id: UUID
    dag_version: int
    first_day: int
    last_day: int
    retried_by: UUID | None


def fields(p: Any) -> dict[str, Any]:
    """A params record as the named SQL's parameter dict: its own fields, not copied (no record
    holds another; `asdict` deep-copied every config and output list, per task)."""
    names = _NAMES.get(type(p))
    if names is None:
        names = _NAMES[type(p)] = tuple(f.name for f in dataclass_fields(p))
    return {n: getattr(p, n) for n in names}


_NAMES: dict[type, tuple[str, ...]] = {}


__all__ = [
    "AttemptEnd",
    "ClaimManyParams",
    "ClaimParams",
    "HeartbeatParams",
    "LeaseCheck",
    "NewCommit",
    "NewEvent",
    "NewTask",
    "PoolJob",
    "PoolKey",
    "ReadsParams",
    "RetryParams",
    "SlotLeaseParams",
    "StateKey",
    "TaskKey",
    "Wakeup",
    "fields",
]
