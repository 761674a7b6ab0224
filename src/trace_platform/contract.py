"""The wire contract: the bodies the gateway, the dispatcher, the worker and the operators exchange.

A task is submitted as a `TaskSpec` (answered by a `TaskRef`); a worker claims it (`ClaimRequest`,
`Claim`), fetches its `TaskPayload`, speaks for its attempt with a `LeaseRef` (heartbeats,
events, completion) and reports what it produced as `EventIn`s and `OutputCommit`s. The
limits every side enforces the same way live here too."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Self
from uuid import UUID

from pydantic import UUID4, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import to_json

LITE_ORG_ID = UUID("00000000-0000-0000-0000-000000000001")

TaskStatus = Literal["queued", "running", "succeeded", "failed", "canceled", "buffered"]
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "canceled"})

MAX_EVENTS_PER_CALL = 1000
MAX_CONFIG_BYTES = 1024 * 1024
MAX_ERROR_CHARS = 20_000  # a failure's text as stored (a longer one is cut by the worker)
MAX_PROGRESS_BYTES = 4096  # a progress report is a few counters, stored on every heartbeat
# An attempt number as stored (INT): one past it names no attempt, and in a batch of heartbeats
# (one bigint[] for all) a number past bigint failed every heartbeat of the batch.
MAX_ATTEMPT = 2**31 - 1


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetRef(_Body):
    """A dataset pinned to one version for the whole task (an input, or an output to write)."""

    dataset_uuid: UUID
    dataset_version: UUID | None = None
    dataset_name: str | None = None
    backend: Literal["parquet", "postgres"] | None = None
    location: str | None = None
    output_index: int | None = None
    # An output's update strategy: `append` with a unique_key never repeats a key (publish_frame).
    update_strategy: Literal["replace", "append"] | None = None
    unique_key: list[str] | None = None


MAX_BACKOFF_SECONDS = 30 * 24 * 3600


class TaskSpec(_Body):
    job: str = Field(min_length=1, max_length=200)
    operator: str = Field(min_length=1, max_length=200)
    runtime: str = Field(default="ecs_platform", pattern=r"^(ecs_[a-z][a-z0-9_]*|lambda)$")
    config: dict[str, Any] = Field(default_factory=dict)
    org_id: UUID = LITE_ORG_ID
    dag_id: UUID | None = None
    dag_version: int | None = None
    parent_task_id: UUID | None = None
    input_event_id: UUID | None = None
    input_event: dict[str, Any] | None = None
    input_versions: list[DatasetRef] = Field(default_factory=list)
    outputs: list[DatasetRef] = Field(default_factory=list)
    run_id: UUID | None = None
    worker_pool: str | None = None
    max_concurrency: int | None = Field(default=None, gt=0, le=10_000)  # as a DAG job's
    timeout_seconds: int | None = Field(default=None, gt=0, le=7 * 24 * 3600)
    max_attempts: int | None = Field(default=None, gt=0, le=100)
    # At most 30 days: a retry's wake-up delay is stored in whole seconds (an INT column).
    retry_backoff_seconds: float | None = Field(default=None, ge=0, le=MAX_BACKOFF_SECONDS)
    retry_backoff_max_seconds: float | None = Field(default=None, ge=0, le=MAX_BACKOFF_SECONDS)


class TaskRef(BaseModel):
    task_id: UUID
    start_day: int
    status: TaskStatus


class ClaimRequest(_Body):
    task_id: UUID
    worker_id: str = Field(min_length=1, max_length=200)
    # The worker's key for this claim, sent unchanged when it retries the request: it becomes
    # the lease token, so a claim that committed but whose answer was lost is answered again
    # (the same lease) instead of refused, and the task is not stranded until its lease ends.
    # A secret as a lease token is: a random (version 4) UUID, never derived from anything.
    claim_id: UUID4 | None = None
    start_day: int | None = None  # accepted from older workers, unused (see LeaseRef)


class SlotLease(BaseModel):
    pool: str
    slot_index: int


class Claim(BaseModel):
    task_id: UUID
    start_day: int
    attempt: int
    lease_token: UUID
    lease_until: datetime
    heartbeat_seconds: float
    slot: SlotLease | None = None
    # The task-fetch payload, read in the claim's own transaction, when the caller asked for
    # it (the internal API always does): one round trip and one transaction fewer per task. A
    # wrapper that gets none (an older API) fetches it with `/internal/task-fetch`.
    task: TaskPayload | None = None


class LeaseRef(_Body):
    """Every fenced call names the attempt it speaks for and proves it holds that lease. On
    the wire it travels one way on every call: `task_id` and `attempt` in the query string,
    the token in the `X-Lease-Token` header (never in a URL or a body, so never logged; the
    one exception is a claim's `claim_id`, which becomes the token, in the claim's body)."""

    task_id: UUID
    attempt: int = Field(gt=0, le=MAX_ATTEMPT)
    lease_token: UUID
    # Accepted from older callers, unused and never sent: the task's status row
    # (hash-partitioned by task_id) holds its start_day, which prunes every lookup joined to it.
    start_day: int | None = None


LEASE_TOKEN_HEADER = "X-Lease-Token"


def lease_params(ref: LeaseRef) -> dict[str, Any]:
    """The query string and header a fenced call carries its lease reference in."""
    return {
        "params": {"task_id": str(ref.task_id), "attempt": ref.attempt},
        "headers": {LEASE_TOKEN_HEADER: str(ref.lease_token)},
    }


class HeartbeatBody(_Body):
    progress: dict[str, Any] | None = None  # the operator's latest ctx.progress, if any

    @model_validator(mode="after")
    def _small_progress(self) -> Self:
        if self.progress is not None and progress_size(self.progress) > MAX_PROGRESS_BYTES:
            raise ValueError(f"progress is larger than {MAX_PROGRESS_BYTES} bytes of JSON")
        return self


def progress_size(progress: dict[str, Any]) -> int:
    """Bytes of JSON (UTF-8) the heartbeat carries `progress` in: its own serializer, whose
    depth limit is lower than json's (ValueError past it)."""
    return len(to_json(progress, fallback=str))


def progress_text(progress: dict[str, Any] | None, width: int = 80) -> str:
    """A stored progress report as one short line: `datatype=logs rows=1,204`."""
    if not progress:
        return ""
    parts = []
    for k, v in progress.items():
        shown = f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)
        parts.append(f"{k}={shown}")
    text = " ".join(parts)
    return text if len(text) <= width else text[: width - 1] + "…"


class HeartbeatResponse(BaseModel):
    status: TaskStatus
    lease_until: datetime
    cancel_requested: bool


class RangeSpec(_Body):
    start: int
    end: int

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.end < self.start:
            raise ValueError(f"range end {self.end} is before start {self.start}")
        return self


def scope_key(partition_key: str | None, rng: RangeSpec | None) -> str:
    """One spelling of a data scope, shared by event identity and output commits."""
    if partition_key is not None:
        return f"partition:{partition_key}"
    if rng is not None:
        return f"range:{rng.start}-{rng.end}"
    return "all"


class EventIn(_Body):
    """An event names exactly one of cursor, partition_key or range: that is its identity."""

    dataset_uuid: UUID
    cursor: str | None = Field(default=None, max_length=512)
    partition_key: str | None = Field(default=None, max_length=512)
    range: RangeSpec | None = None
    payload: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_identity(self) -> Self:
        given = [n for n in ("cursor", "partition_key", "range") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "an event needs exactly one of cursor, partition_key or range"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self

    @property
    def dedupe_key(self) -> str:
        if self.cursor is not None:
            return f"cursor:{self.cursor}"
        return scope_key(self.partition_key, self.range)


BLOCK_HASH = r"^0x[0-9a-f]{64}$"


class ChainIdentity(_Body):
    """Which chain a block range was read from: a reorg or a reset chain with the same id
    changes the hashes, so a commit that records them can be checked against the node."""

    chain_id: int = Field(ge=0)
    first_hash: str = Field(pattern=BLOCK_HASH)  # the range's first block
    parent_hash: str = Field(pattern=BLOCK_HASH)  # that block's parent
    last_hash: str = Field(pattern=BLOCK_HASH)  # the range's last block


class OutputCommit(_Body):
    """A committed piece of an output dataset version: a partition, a range, or all of it."""

    dataset_uuid: UUID
    dataset_version: UUID | None = None  # default: the version the task was given
    partition_key: str | None = Field(default=None, max_length=512)
    range: RangeSpec | None = None
    location: str | None = Field(default=None, max_length=2048)
    row_count: int | None = Field(default=None, ge=0)
    byte_count: int | None = Field(default=None, ge=0)
    chain: ChainIdentity | None = None  # raw chain data: the blocks it was read from

    @model_validator(mode="after")
    def _one_scope(self) -> Self:
        if self.partition_key is not None and self.range is not None:
            raise ValueError("an output commit names a partition_key or a range, not both")
        return self

    @property
    def scope(self) -> str:
        return scope_key(self.partition_key, self.range)


class CommittedScope(BaseModel):
    """A committed piece of a dataset version as an attempt found it at fetch: where its files
    are (`location`, that attempt's own keys), for reading exactly what was committed."""

    dataset_uuid: UUID
    dataset_version: UUID
    scope: str
    range: RangeSpec | None = None
    location: str
    chain: ChainIdentity | None = None


class HeartbeatRequest(LeaseRef, HeartbeatBody):
    """A heartbeat as the Dispatcher takes it: the lease reference and the body."""


class EventsBody(_Body):
    events: list[EventIn] = Field(min_length=1, max_length=MAX_EVENTS_PER_CALL)


class EventsRequest(LeaseRef, EventsBody):
    pass


class EventsResponse(BaseModel):
    accepted: int
    duplicates: int
    event_ids: list[UUID]
    tasks_created: int = 0


class CompleteBody(_Body):
    # `released`: the worker hands the attempt back unfinished (it is shutting down); the task
    # is queued again at once and the attempt is not one of its tries.
    outcome: Literal["succeeded", "failed", "canceled", "released"]
    error: str | None = Field(default=None, max_length=MAX_ERROR_CHARS)
    retryable: bool = True
    final_events: list[EventIn] = Field(default_factory=list, max_length=MAX_EVENTS_PER_CALL)
    outputs: list[OutputCommit] = Field(default_factory=list, max_length=MAX_EVENTS_PER_CALL)
    # Saved with a successful completion, in the same transaction as its events, only if the
    # stored state is still at the revision this attempt read (compare-and-set).
    operator_state: dict[str, Any] | None = None
    operator_state_revision: int = 0

    @model_validator(mode="after")
    def _only_success_carries(self) -> Self:
        # A failure, a cancel or a hand-back lands nothing (a late one would land it past the
        # guards a success passes: withdrawn versions, whole outputs, the state's revision).
        if self.outcome != "succeeded" and (
            self.final_events or self.outputs or self.operator_state is not None
        ):
            raise ValueError(
                f"a {self.outcome} attempt carries no events, outputs or state (only a "
                "success lands them)"
            )
        return self


class CompleteRequest(LeaseRef, CompleteBody):
    pass


class CompleteResponse(BaseModel):
    task_id: UUID
    attempt: int
    status: TaskStatus
    next_attempt_at: datetime | None = None
    events_accepted: int = 0
    events_duplicate: int = 0
    tasks_created: int = 0
    outputs_committed: int = 0


# -- batches: several wake-ups claimed, several attempts completed, in one request each ------
MAX_BATCH = 100
# A complete-batch's lease tokens: one per completion, in the body's order, comma-separated,
# in this header (never in a URL or a body, as every lease token).
LEASE_TOKENS_HEADER = "X-Lease-Tokens"


class BatchError(BaseModel):
    """One item's refusal within a batch: what the one-task call would have answered."""

    status: int
    error: str
    message: str
    detail: dict[str, Any] = Field(default_factory=dict)


class ClaimBatchBody(_Body):
    claims: list[ClaimRequest] = Field(min_length=1, max_length=MAX_BATCH)


class ClaimResult(BaseModel):
    task_id: UUID
    claim: Claim | None = None
    error: BatchError | None = None


class ClaimBatchResponse(BaseModel):
    results: list[ClaimResult]  # one per task id, in the body's order


class CompleteItem(CompleteBody):
    """One completion of a batch: the attempt it speaks for and its report (its lease token
    travels in LEASE_TOKENS_HEADER)."""

    task_id: UUID
    attempt: int = Field(gt=0, le=MAX_ATTEMPT)


class CompleteBatchBody(_Body):
    completions: list[CompleteItem] = Field(min_length=1, max_length=MAX_BATCH)


class CompleteResult(BaseModel):
    task_id: UUID
    response: CompleteResponse | None = None
    error: BatchError | None = None


class CompleteBatchResponse(BaseModel):
    results: list[CompleteResult]  # one per completion, in the body's order


class ExchangeBody(_Body):
    """A worker's finished attempts and its next wake-ups in one request (`/internal/exchange`):
    the completions land first, then the claims are leased, in one commit when every item
    takes the batch path. The completions' lease tokens travel in LEASE_TOKENS_HEADER."""

    completions: list[CompleteItem] = Field(default_factory=list, max_length=MAX_BATCH)
    claims: list[ClaimRequest] = Field(default_factory=list, max_length=MAX_BATCH)

    @model_validator(mode="after")
    def _not_empty(self) -> ExchangeBody:
        if not self.completions and not self.claims:
            raise ValueError("an exchange carries at least one completion or claim")
        return self


class ExchangeResponse(BaseModel):
    completions: list[CompleteResult]  # one per completion, in the body's order
    claims: list[ClaimResult]  # one per claim, in the body's order


BUFFER_CONTENT_TYPES = {
    ".jsonl": "application/jsonl",
    ".parquet": "application/vnd.apache.parquet",
}


class BufferPublishBody(_Body):
    """A pointer to a batch an attempt wrote for a buffered dataset (`/internal/buffer-publish`,
    sent by the wrapper, never the operator): the artifact's key, below the attempt's own
    buffer prefix (`layout.buffer_prefix`), ending .jsonl or .parquet."""

    dataset: str = Field(pattern=r"^[a-z][a-z0-9_]{0,127}$")
    location: str = Field(min_length=1, max_length=2048)

    @property
    def content_type(self) -> str | None:
        return next(
            (t for ext, t in BUFFER_CONTENT_TYPES.items() if self.location.endswith(ext)), None
        )


class BufferPublishRequest(LeaseRef, BufferPublishBody):
    pass


class BufferPublishResponse(BaseModel):
    record_id: UUID
    dataset_uuid: UUID
    duplicate: bool  # this artifact was published before: the same record answers


class IdempotencyContext(BaseModel):
    """What an operator needs to make its writes idempotent across retries."""

    producer_task_id: UUID
    attempt: int
    dedupe_key_shape: str = "(producer_task_id, dataset_uuid, cursor|partition_key|range)"


class TaskPayload(BaseModel):
    """The task-fetch payload: everything a worker needs, defined once (decisions note, open item)."""

    task_id: UUID
    attempt: int
    start_day: int
    status: TaskStatus  # `canceled` tells the wrapper to exit without running the operator
    cancel_requested: bool
    org_id: UUID
    dag_id: UUID | None
    dag_version: int | None
    job: str
    operator: str
    runtime: str
    config: dict[str, Any]
    parent_task_id: UUID | None
    input_event: dict[str, Any] | None
    inputs: list[DatasetRef]
    outputs: list[DatasetRef]
    run_id: UUID | None
    worker_pool: str | None
    slot_index: int | None
    slot_env: dict[str, str]
    slot_secret_names: list[str]  # values come only from /internal/task-secrets
    operator_state: dict[str, Any] | None = None  # the job's durable state, if it keeps one
    operator_state_revision: int = 0  # what a state saved by this attempt must build on
    idempotency: IdempotencyContext
    # What this attempt reads, as committed when it was fetched: its input event's scope in
    # the input it arrived on (every scope of every input, for an operator that reads whole
    # inputs), and the other scopes of an append output with a unique_key that overlap it.
    committed: list[CommittedScope] = Field(default_factory=list)
    timeout_seconds: int
    deadline_at: datetime | None
    lease_until: datetime | None
    heartbeat_seconds: float


Claim.model_rebuild()  # `task` names TaskPayload, defined below it
