"""The state store's one narrow protocol: everything the task lifecycle reads and writes.

A `StateStore` opens transactions; a `StoreTx` is one transaction's calls. Each call is one
statement's worth of work with typed parameters (`params.py`) and returns plain rows (dicts
keyed by column). Two stores implement it: `PostgresStore` (the named SQL in
`db/sql/dispatcher.sql`, the product) and `MemoryStore` (its in-memory twin, for lifecycle unit
tests without Postgres); `tests/support/store_conformance.py` is the one conformance suite both pass.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol
from uuid import UUID

from trace_platform.contract import EventIn, TaskSpec
from trace_platform.store.tasks.params import (
    AttemptEnd,
    ClaimManyParams,
    ClaimParams,
    FreedSlot,
    HeartbeatParams,
    LeaseCheck,
    NewCommit,
    NewEvent,
    NewTask,
    PoolJob,
    PoolKey,
    ReadsParams,
    RetryParams,
    RunRetryParams,
    SlotLeaseParams,
    StateKey,
    TaskKey,
    Wakeup,
)

Row = dict[str, Any]


class StoreTx(Protocol):
    """The calls of one transaction (rolled back as a whole if the block raises)."""

    # -- tasks: intents, views --------------------------------------------------------------
    def insert_tasks(self, ps: list[NewTask]) -> list[int]:
        """Writes each task's registry and status rows (one statement for all of them); returns
        their start days, in order."""
        ...

    def status(self, task_id: UUID) -> Row | None:
        """The status row alone."""
        ...

    def status_for_update(self, task_id: UUID) -> Row | None:
        """The status row (locked to the end of the transaction) with what fencing and
        completion need: budget, outputs, DAG, `version_state`, `withdrawn`, `reprocessing`."""
        ...

    def task_view(self, task_id: UUID) -> Row | None:
        """Registry and status of one task, joined."""
        ...

    def task_attempts(self, key: TaskKey) -> list[Row]: ...

    def task_event_count(self, key: TaskKey) -> int: ...

    def list_tasks(self, limit: int) -> list[Row]:
        """The newest tasks first."""
        ...

    def task_dag_paused(self, task_id: UUID) -> Row | None:
        """`{name, paused}` of the task's DAG (None: no DAG)."""
        ...

    def lock_task_dag_shared(self, task_id: UUID) -> None:
        """The task's DAG change lock, shared, to the end of the transaction."""
        ...

    def lock_dag_shared(self, dag_id: UUID) -> None:
        """The DAG's change lock, shared, to the end of the transaction."""
        ...

    # -- the lease --------------------------------------------------------------------------
    def claim(self, p: ClaimParams) -> Row | None:
        """Leases a claimable task and opens its attempt: `{task_id, start_day, attempt,
        lease_token, lease_until}`, or None when it is not claimable now."""
        ...

    def claim_many(self, p: ClaimManyParams) -> list[Row]:
        """Leases every plain claimable task of `p.task_ids` (no worker pool, no input another
        DAG produces; a row another transaction holds is skipped) and opens its attempt: one
        `task_view` row per task leased, in no particular order."""
        ...

    def heartbeat(self, p: HeartbeatParams) -> Row | None:
        """Extends a running attempt's lease: `{status, lease_until, cancel_requested}`, or
        None when the attempt does not hold it."""
        ...

    def heartbeat_many(self, beats: list[HeartbeatParams]) -> dict[UUID, Row]:
        """`heartbeat` for several tasks (each task at most once, each fenced by its own
        lease): the rows of those extended, by task id; a task missing did not hold it."""
        ...

    def complete_fast(self, p: LeaseCheck) -> bool:
        """A plain success of the current attempt (no slot held) in one step; False: the full
        path must decide."""
        ...

    def complete_fast_many(self, checks: list[LeaseCheck]) -> set[UUID]:
        """`complete_fast` for several attempts at once, each fenced by its own lease: the
        task ids that succeeded (the others must take the full path)."""
        ...

    def finish_attempt(self, p: AttemptEnd) -> None: ...

    def set_succeeded(self, task_id: UUID) -> None: ...

    def set_terminal(self, task_id: UUID, status: str, error: str | None) -> None:
        """failed or canceled; the lease token stays so a retried report is recognised."""
        ...

    def set_retry(self, p: RetryParams) -> Row:
        """Queued again after `backoff`: `{next_attempt_at}`."""
        ...

    def request_cancel(self, task_ids: list[UUID]) -> dict[UUID, Row]:
        """Cancels the queued/buffered tasks of `task_ids`, flags the running ones:
        `{status, cancel_requested}` by task id; a finished (or missing) task is left out."""
        ...

    def expired_leases(self, limit: int, leases: bool = True) -> list[Row]:
        """Running attempts past their lease or deadline (locked, skipping locked ones);
        with `leases` False, past their deadline only."""
        ...

    def revoke_worker_leases(self, worker_ids: list[str]) -> list[Row]:
        """The running attempts these (dead) workers hold, locked, their lease ended now and
        its token cleared (so nothing of theirs is accepted again): `expired_leases` rows, each
        with its `worker_id`."""
        ...

    def untried_attempts(self, key: TaskKey) -> int:
        """Attempts that are not tries: `state_conflict` and `released`, and every attempt up
        to the task's latest retry by hand (`retry_failed`: a fresh budget of tries)."""
        ...

    def retry_failed(self, p: RunRetryParams) -> list[Row]:
        """Queues again now each of the run's tasks that ended failed (not one whose cancel was
        asked), its lease token cleared, and notes the retry (its tries count afresh):
        `{task_id, start_day, attempt, job, runtime}` of each, in task_id order."""
        ...

    def fail_unstarted(self, task_id: UUID, error: str) -> None:
        """A queued or buffered task that may not run ends failed before any attempt."""
        ...

    def stranded_queued(self, after_seconds: float, limit: int) -> list[Row]:
        """Claimable queued tasks untouched for `after_seconds` (locked, skipping locked)."""
        ...

    def touch(self, task_ids: list[UUID]) -> None: ...

    # -- the outbox -------------------------------------------------------------------------
    def insert_outbox(self, w: Wakeup) -> None: ...

    def insert_outbox_many(self, ws: list[Wakeup]) -> None:
        """`insert_outbox` for many, in one statement, in order."""
        ...

    def insert_task_wakeup(self, task_id: UUID, w: Wakeup, by_runtime: dict[str, str]) -> None:
        """`w`, the wake-up of task `task_id`, on the queue `by_runtime` names for the task's
        runtime (any other runtime's: `w.queue`)."""
        ...

    def claim_pending(self, limit: int) -> list[Row]:
        """Unsent outbox rows, oldest first (locked, skipping locked)."""
        ...

    def mark_sent(self, ids: list[int]) -> None: ...

    def mark_failed(self, ids: list[int], error: str) -> None: ...

    def purge_sent(self, older_than_seconds: float) -> int: ...

    def pending_count(self) -> int: ...

    # -- worker-pool slots ------------------------------------------------------------------
    def task_pool(self, task_id: UUID) -> Row | None:
        """`{dag_id, worker_pool, max_concurrency, job, operator}`."""
        ...

    def lock_pool(self, key: PoolKey) -> None:
        """Serialises slot accounting of one pool to the end of the transaction."""
        ...

    def pool_usage(self, key: PoolJob) -> Row:
        """`{job_running, job_running_in_dag, free_slot}`: slots the job holds in the pool and
        in any pool of its DAG, the lowest free slot (or None)."""
        ...

    def lease_slot(self, p: SlotLeaseParams) -> None: ...

    def release_slot(self, task_id: UUID) -> FreedSlot | None:
        """Frees the task's slot; which pool it was in and who held it (None: it held none)."""
        ...

    def waiting_for_pool(self, key: PoolKey, skip_job: str | None = None) -> list[UUID]:
        """Queued tasks that can take the pool's free slots now, oldest first; none of
        whole writer `skip_job`'s runs."""
        ...

    def waiting_for_job(self, dag_id: UUID, job: str) -> list[UUID]:
        """The oldest queued run of whole writer `job` that can claim now, in any pool of its
        DAG (none while a whole run of the job holds a slot)."""
        ...

    def slot_of_task(self, task_id: UUID) -> Row | None:
        """`{pool, slot_index, env, secrets}` of the slot the task holds."""
        ...

    def slot_secret_values(self, task_id: UUID, org_id: UUID) -> list[Row]:
        """The sealed secrets the task's slot names, with who may use them."""
        ...

    def seal_legacy_secrets(self, vault: Any) -> int:
        """Seals secrets stored before encryption (see `identity/vault.py`)."""
        ...

    def task_deployer(self, key: TaskKey) -> Row | None:
        """The user who deployed the task's DAG version, roles as they are now."""
        ...

    # -- read access ------------------------------------------------------------------------
    def foreign_inputs(self, task_id: UUID) -> list[Row]:
        """The task's inputs another DAG produces, with their read rules."""
        ...

    def task_deployer_any_day(self, task_id: UUID) -> Row | None: ...

    # -- operator state ---------------------------------------------------------------------
    def operator_state(self, key: StateKey) -> Row | None:
        """`{state, revision}` in the job's lineage."""
        ...

    def lock_operator_state(self, key: StateKey) -> None: ...

    def save_operator_state(self, key: StateKey, state: Any, task_id: UUID) -> None:
        """Saves and bumps the revision."""
        ...

    # -- events, commits and reads ----------------------------------------------------------
    def insert_events(self, events: list[NewEvent]) -> list[UUID | None]:
        """Each event's id, or None for a duplicate (same producer, dataset and dedupe key)."""
        ...

    def tasks_for_event(
        self, *, org_id: UUID, producer: Row, event_id: UUID, event: EventIn, invalidates: bool
    ) -> list[tuple[TaskSpec, str]]:
        """The tasks an event starts in subscribed DAG jobs, with their first status."""
        ...

    def insert_commit(self, c: NewCommit) -> str | None:
        """Lands a scope's commit, retiring the location it replaces; the dataset's update
        strategy when it rewrote an earlier commit's location (None otherwise)."""
        ...

    def existing_versions(self, versions: list[str]) -> set[str]:
        """Which of these dataset versions still exist (held against a purge)."""
        ...

    def output_strategies(self, versions: list[UUID]) -> list[Row]:
        """`{dataset_version, update_strategy, unique_key}` of each version."""
        ...

    def committed_reads(self, p: ReadsParams) -> list[Row]: ...


class StateStore(Protocol):
    def transaction(self) -> AbstractContextManager[StoreTx]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        ...

    def statement(self) -> AbstractContextManager[StoreTx]:
        """Calls that are each their own transaction (no BEGIN and COMMIT around them): for
        one statement alone, or reads that need no snapshot in common with it."""
        ...

    def adopt(self, conn: Any) -> StoreTx:
        """The calls of a transaction a caller outside the dispatcher already holds."""
        ...

    def ensure_partitions(self) -> int:
        """Creates the day partitions ahead of time; how many were made."""
        ...
