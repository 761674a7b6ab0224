"""One transaction's calls on the in-memory tables: each does what its named query does."""

from __future__ import annotations

import copy
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from trace_platform.contract import EventIn, TaskSpec
from trace_platform.store.tasks.memory.tables import (
    _ATTEMPT,
    _BLOCK_HASH,
    _COMMITTED_READ,
    _FOR_UPDATE_REGISTRY,
    _OUTCOMES,
    _STATUS,
    _UNTRIED,
    _VIEW_REGISTRY,
    _VIEW_STATUS,
    ConstraintViolation,
    _check_status,
    _coalesce,
    _eq,
    _json_text,
    _jsonb,
    _limit,
    _lt,
    _not_null,
    _pg_bool,
    _pick,
    _start_day,
    _Tables,
    _uuid,
)
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
    SlotLeaseParams,
    StateKey,
    TaskKey,
    Wakeup,
)
from trace_platform.store.tasks.protocol import Row

if TYPE_CHECKING:
    from trace_platform.store.tasks.memory import MemoryStore


class MemoryTx:
    """One transaction's calls on the store's tables (see the module docstring)."""

    def __init__(self, store: MemoryStore, now: datetime) -> None:
        self.store = store
        self.now = now  # Postgres's now(): the transaction's start, the same for every call

    @property
    def _t(self) -> _Tables:
        # Looked up on each call: a nested transaction's rollback swaps the store's tables.
        return self.store._tables

    def _joined(self) -> Iterator[tuple[Row, Row]]:
        """task_status JOIN task_registry ON task_id and start_day."""
        for s in self._t.task_status.values():
            r = self._t.task_registry.get(s["task_id"])
            if r is not None and r["start_day"] == s["start_day"]:
                yield s, r

    def _dag_paused(self, dag_id: UUID | None) -> bool:
        """EXISTS (SELECT 1 FROM dags d WHERE d.dag_id = r.dag_id AND d.paused)."""
        dag = self._t.dags.get(dag_id) if dag_id is not None else None
        return dag is not None and bool(dag["paused"])

    def _slot_of(self, task_id: UUID) -> Row | None:
        for slot in self._t.pool_slots.values():
            if slot["leased_by_task"] == task_id:
                return slot
        return None

    # -- tasks: intents, views --------------------------------------------------------------
    def insert_tasks(self, ps: list[NewTask]) -> list[int]:
        # One statement in Postgres: a duplicate among them leaves none of them.
        if len({p.task_id for p in ps}) < len(ps):
            raise ConstraintViolation("task_status_pkey: a task id given twice")
        return [self._insert_task(p) for p in ps]

    def _insert_task(self, p: NewTask) -> int:
        if p.task_id in self._t.task_status:
            raise ConstraintViolation(f"task_status_pkey: task {p.task_id} already exists")
        start_day = _start_day(self.now)
        registry: Row = {
            "task_id": p.task_id,
            "start_day": start_day,
            "org_id": p.org_id,
            "dag_id": p.dag_id,
            "dag_version": p.dag_version,
            "job": p.job,
            "operator": p.operator,
            "runtime": p.runtime,
            "config": _jsonb(p.config),
            "parent_task_id": p.parent_task_id,
            "input_event_id": p.input_event_id,
            "input_event": _jsonb(p.input_event),
            "input_versions": _jsonb(p.input_versions),
            "timeout_seconds": p.timeout_seconds,
            "max_attempts": p.max_attempts,
            "retry_backoff_seconds": p.retry_backoff_seconds,
            "retry_backoff_max_seconds": p.retry_backoff_max_seconds,
            "created_at": self.now,
            "run_id": p.run_id,
            "worker_pool": p.worker_pool,
            "max_concurrency": p.max_concurrency,
            "outputs": _jsonb(p.outputs),
        }
        _not_null(
            "task_registry",
            registry,
            (
                "task_id",
                "org_id",
                "job",
                "operator",
                "runtime",
                "config",
                "input_versions",
                "timeout_seconds",
                "max_attempts",
                "retry_backoff_seconds",
                "retry_backoff_max_seconds",
                "outputs",
            ),
        )
        if registry["timeout_seconds"] <= 0:
            raise ConstraintViolation("task_registry_timeout_seconds_check")
        if registry["max_attempts"] <= 0:
            raise ConstraintViolation("task_registry_max_attempts_check")
        _check_status(p.status)
        for k in ("retry_backoff_seconds", "retry_backoff_max_seconds"):
            registry[k] = float(registry[k])  # double precision
        status: Row = dict.fromkeys(_STATUS)
        status.update(
            task_id=p.task_id,
            start_day=start_day,
            status=p.status,
            attempt=0,
            next_attempt_at=self.now,
            cancel_requested=False,
            updated_at=self.now,
        )
        status["whole_job"] = p.whole_job if p.worker_pool is not None else None
        self._t.task_registry[p.task_id] = registry
        self._t.task_status[p.task_id] = status
        return start_day

    def status(self, task_id: UUID) -> Row | None:
        s = self._t.task_status.get(task_id)
        return _pick(s, _STATUS) if s is not None else None

    def status_for_update(self, task_id: UUID) -> Row | None:
        s = self._t.task_status.get(task_id)
        r = self._t.task_registry.get(task_id)
        if s is None or r is None or r["start_day"] != s["start_day"]:
            return None
        row = _pick(s, _STATUS) | _pick(r, _FOR_UPDATE_REGISTRY)
        event = r["input_event"]
        invalidates = _json_text(event.get("invalidates")) if isinstance(event, dict) else None
        row["reprocessing"] = _pg_bool(invalidates) if invalidates is not None else False
        # No DAG versions in memory: none was rolled back or abandoned.
        row["version_state"] = None
        row["withdrawn"] = False
        return row

    def task_view(self, task_id: UUID) -> Row | None:
        s = self._t.task_status.get(task_id)
        r = self._t.task_registry.get(task_id)
        if s is None or r is None or r["start_day"] != s["start_day"]:
            return None
        return _pick(r, _VIEW_REGISTRY) | _pick(s, _VIEW_STATUS)

    def task_attempts(self, key: TaskKey) -> list[Row]:
        rows = [
            a
            for a in self._t.task_attempts.values()
            if a["task_id"] == key.task_id and a["start_day"] == key.start_day
        ]
        return [_pick(a, _ATTEMPT) for a in sorted(rows, key=lambda a: a["attempt"])]

    def task_event_count(self, key: TaskKey) -> int:
        return sum(
            1
            for e in self._t.events.values()
            if e["producer_task_id"] == key.task_id and e["start_day"] == key.start_day
        )

    def list_tasks(self, limit: int) -> list[Row]:
        # Ties in created_at (one transaction's tasks) come newest-inserted first.
        joined = list(self._joined())[::-1]
        joined.sort(key=lambda sr: sr[1]["created_at"], reverse=True)
        rows = [
            _pick(r, ("task_id", "job", "operator", "created_at"))
            | _pick(s, ("status", "attempt", "last_error", "finished_at"))
            for s, r in joined
        ]
        return _limit(rows, limit)

    def task_dag_paused(self, task_id: UUID) -> Row | None:
        r = self._t.task_registry.get(task_id)
        dag = self._t.dags.get(r["dag_id"]) if r is not None and r["dag_id"] is not None else None
        return _pick(dag, ("name", "paused")) if dag is not None else None

    def lock_task_dag_shared(self, task_id: UUID) -> None:
        pass  # the store lock already serialises transactions

    # -- the lease --------------------------------------------------------------------------
    def claim(self, p: ClaimParams) -> Row | None:
        s = self._t.task_status.get(p.task_id)
        r = self._t.task_registry.get(p.task_id)
        if (
            s is None
            or r is None
            or r["start_day"] != s["start_day"]
            or (r["worker_pool"] is None) == p.pooled  # `(worker_pool IS NULL) <> pooled`
            or s["status"] != "queued"
            or not (s["next_attempt_at"] <= self.now)
            or s["cancel_requested"]
            or self._dag_paused(r["dag_id"])
        ):
            return None
        attempt = s["attempt"] + 1
        akey = (s["task_id"], s["start_day"], attempt)
        if akey in self._t.task_attempts:
            raise ConstraintViolation(f"task_attempts_pkey: attempt {attempt} exists")
        s.update(
            status="running",
            attempt=attempt,
            lease_token=p.lease_token or uuid.uuid4(),  # gen_random_uuid(): a version 4 UUID
            lease_until=self.now + timedelta(seconds=p.lease),
            heartbeat_at=self.now,
            started_at=self.now,
            deadline_at=self.now + timedelta(seconds=r["timeout_seconds"]),
            worker_id=p.worker_id,
            finished_at=None,
            updated_at=self.now,
            progress=None,
            progress_at=None,
        )
        self._t.task_attempts[akey] = {
            "task_id": s["task_id"],
            "start_day": s["start_day"],
            "attempt": attempt,
            "lease_token": s["lease_token"],
            "worker_id": p.worker_id,
            "started_at": self.now,
            "finished_at": None,
            "outcome": "running",
            "error": None,
        }
        return _pick(s, ("task_id", "start_day", "attempt", "lease_token", "lease_until"))

    def heartbeat(self, p: HeartbeatParams) -> Row | None:
        s = self._t.task_status.get(p.task_id)
        if (
            s is None
            or s["attempt"] != p.attempt
            or not _eq(s["lease_token"], p.lease_token)
            or s["status"] != "running"
        ):
            return None
        s.update(
            lease_until=self.now + timedelta(seconds=p.lease),
            heartbeat_at=self.now,
            updated_at=self.now,
        )
        if p.progress is not None:  # none reported keeps the last one (and its time)
            s.update(progress=_jsonb(p.progress), progress_at=self.now)
        return _pick(s, ("status", "lease_until", "cancel_requested"))

    def claim_many(self, p: ClaimManyParams) -> list[Row]:
        rows = []
        asks = zip(p.task_ids, zip(p.worker_ids, p.lease_tokens, strict=True), strict=True)
        for task_id, (worker_id, token) in sorted(dict(asks).items()):
            if self.foreign_inputs(task_id):
                continue
            one = ClaimParams(
                task_id=task_id, worker_id=worker_id, lease=p.lease, pooled=False, lease_token=token
            )
            if self.claim(one) is not None:
                view = self.task_view(task_id)
                assert view is not None
                rows.append(view)
        return rows

    def complete_fast_many(self, checks: list[LeaseCheck]) -> set[UUID]:
        return {c.task_id for c in checks if self.complete_fast(c)}

    def complete_fast(self, p: LeaseCheck) -> bool:
        s = self._t.task_status.get(p.task_id)
        if (
            s is None
            or s["attempt"] != p.attempt
            or not _eq(s["lease_token"], p.lease_token)
            or s["status"] not in ("running", "queued", "failed")
            or self._slot_of(p.task_id) is not None
        ):
            return False
        self.set_succeeded(p.task_id)
        self.finish_attempt(
            AttemptEnd(p.task_id, s["start_day"], p.attempt, outcome="succeeded", error=None)
        )
        return True

    def finish_attempt(self, p: AttemptEnd) -> None:
        a = self._t.task_attempts.get((p.task_id, p.start_day, p.attempt))
        if a is None:
            return
        if p.outcome not in _OUTCOMES:
            raise ConstraintViolation(f"task_attempts_outcome_check: outcome {p.outcome!r}")
        # coalesce: the first end time stays, and an error is never erased by None.
        a.update(
            finished_at=a["finished_at"] if a["finished_at"] is not None else self.now,
            outcome=p.outcome,
            error=p.error if p.error is not None else a["error"],
        )

    def set_succeeded(self, task_id: UUID) -> None:
        s = self._t.task_status.get(task_id)
        if s is not None:
            s.update(
                status="succeeded",
                lease_until=None,
                finished_at=self.now,
                updated_at=self.now,
                last_error=None,
            )

    def set_terminal(self, task_id: UUID, status: str, error: str | None) -> None:
        s = self._t.task_status.get(task_id)
        if s is None:
            return
        _check_status(status)
        s.update(
            status=status,
            lease_until=None,
            finished_at=self.now,
            updated_at=self.now,
            last_error=error if error is not None else s["last_error"],
        )

    def set_retry(self, p: RetryParams) -> Row:
        s = self._t.task_status.get(p.task_id)
        assert s is not None, f"task {p.task_id} has no status row"
        s.update(
            status="queued",
            lease_until=None,
            updated_at=self.now,
            last_error=p.error,
            next_attempt_at=self.now + timedelta(seconds=p.backoff),
        )
        return _pick(s, ("next_attempt_at",))

    def request_cancel(self, task_id: UUID) -> Row | None:
        s = self._t.task_status.get(task_id)
        if s is None or s["status"] not in ("queued", "buffered", "running"):
            return None
        if s["status"] in ("queued", "buffered"):  # not started: canceled at once
            s.update(status="canceled", finished_at=self.now)
        s.update(cancel_requested=True, updated_at=self.now)
        return _pick(s, ("status", "cancel_requested"))

    def expired_leases(self, limit: int) -> list[Row]:
        now = self.now
        rows = [
            (s, r)
            for s, r in self._joined()
            if s["status"] == "running"
            and (_lt(s["lease_until"], now) or _lt(s["deadline_at"], now))
        ]
        # ORDER BY lease_until: NULLs last, as Postgres sorts them ascending.
        rows.sort(key=lambda sr: (sr[0]["lease_until"] is None, sr[0]["lease_until"] or now))
        out = [
            _pick(s, ("task_id", "start_day", "attempt", "cancel_requested"))
            | {"timed_out": None if s["deadline_at"] is None else s["deadline_at"] < now}
            | _pick(r, ("max_attempts", "retry_backoff_seconds", "retry_backoff_max_seconds"))
            for s, r in rows
        ]
        return _limit(out, limit)

    def untried_attempts(self, key: TaskKey) -> int:
        return sum(
            1
            for a in self._t.task_attempts.values()
            if a["task_id"] == key.task_id
            and a["start_day"] == key.start_day
            and a["outcome"] in _UNTRIED
        )

    def fail_unstarted(self, task_id: UUID, error: str) -> None:
        s = self._t.task_status.get(task_id)
        if s is not None and s["status"] in ("queued", "buffered"):
            s.update(status="failed", last_error=error, finished_at=self.now, updated_at=self.now)

    def stranded_queued(self, after_seconds: float, limit: int) -> list[Row]:
        quiet_since = self.now - timedelta(seconds=after_seconds)
        stranded = [
            s
            for s in self._t.task_status.values()
            if s["status"] == "queued"
            and not s["cancel_requested"]
            and s["next_attempt_at"] <= self.now
            and s["updated_at"] < quiet_since
            and not self._registry_dag_paused(s)
        ]
        stranded.sort(key=lambda s: s["updated_at"])  # oldest first, as the SQL store
        return _limit([_pick(s, ("task_id", "start_day")) for s in stranded], limit)

    def _registry_dag_paused(self, s: Row) -> bool:
        r = self._t.task_registry.get(s["task_id"])
        return r is not None and r["start_day"] == s["start_day"] and self._dag_paused(r["dag_id"])

    def touch(self, task_ids: list[UUID]) -> None:
        for task_id in set(task_ids):
            s = self._t.task_status.get(task_id)
            if s is not None:
                s["updated_at"] = self.now

    # -- the outbox -------------------------------------------------------------------------
    def insert_outbox_many(self, ws: list[Wakeup]) -> None:
        for w in ws:
            self.insert_outbox(w)

    def insert_outbox(self, w: Wakeup) -> None:
        json.loads(w.payload)  # the jsonb column refuses text that is not JSON
        oid = next(self.store._outbox_ids)
        self._t.outbox[oid] = {
            "id": oid,
            "queue_name": w.queue,
            "payload": w.payload,  # the JSON text; read back parsed, as psycopg loads jsonb
            "delay_seconds": w.delay,
            "created_at": self.now,
            "sent_at": None,
            "publish_errors": 0,
            "last_error": None,
        }

    def claim_pending(self, limit: int) -> list[Row]:
        rows = [
            {
                "id": o["id"],
                "queue_name": o["queue_name"],
                "payload": json.loads(o["payload"]),  # jsonb, as psycopg loads it
                "delay_seconds": o["delay_seconds"],
            }
            for _, o in sorted(self._t.outbox.items())
            if o["sent_at"] is None
        ]
        return _limit(rows, limit)

    def mark_sent(self, ids: list[int]) -> None:
        for oid in set(ids):
            o = self._t.outbox.get(oid)
            if o is not None:
                o["sent_at"] = self.now

    def mark_failed(self, ids: list[int], error: str) -> None:
        for oid in set(ids):
            o = self._t.outbox.get(oid)
            if o is not None:
                o.update(publish_errors=o["publish_errors"] + 1, last_error=error)

    def purge_sent(self, older_than_seconds: float) -> int:
        cutoff = self.now - timedelta(seconds=older_than_seconds)
        gone = [oid for oid, o in self._t.outbox.items() if _lt(o["sent_at"], cutoff)]
        for oid in gone:
            del self._t.outbox[oid]
        return len(gone)

    def pending_count(self) -> int:
        return sum(1 for o in self._t.outbox.values() if o["sent_at"] is None)

    # -- worker-pool slots ------------------------------------------------------------------
    def task_pool(self, task_id: UUID) -> Row | None:
        r = self._t.task_registry.get(task_id)
        return (
            _pick(r, ("dag_id", "worker_pool", "max_concurrency", "job", "operator")) if r else None
        )

    def lock_pool(self, key: PoolKey) -> None:
        pass  # the store lock already serialises transactions

    def _pool(self, dag_id: UUID, pool: str) -> list[Row]:
        return [
            slot
            for slot in self._t.pool_slots.values()
            if slot["dag_id"] == dag_id and slot["pool"] == pool
        ]

    @staticmethod
    def _free_slots(slots: list[Row]) -> list[int]:
        """The free slots a claim may take: live ones, or a dropped pool's retired ones (as
        dispatcher.sql's pool_usage)."""
        dropped = all(s["retired"] for s in slots)
        return [
            s["slot_index"]
            for s in slots
            if s["leased_by_task"] is None and s["retired"] == dropped
        ]

    def _whole_held(self, dag_id: UUID) -> Counter[str]:
        """Slots whole-writer runs hold in any pool of the DAG, by job."""
        return Counter(
            s["leased_job"]
            for s in self._t.pool_slots.values()
            if s["dag_id"] == dag_id and s["leased_whole"]
        )

    def pool_usage(self, key: PoolJob) -> Row:
        slots = self._pool(key.dag_id, key.pool)
        free = self._free_slots(slots)
        return {
            "job_running": sum(1 for s in slots if _eq(s["leased_job"], key.job)),
            "job_running_in_dag": self._whole_held(key.dag_id)[key.job],
            "free_slot": min(free) if free else None,
        }

    def lease_slot(self, p: SlotLeaseParams) -> None:
        slot = self._t.pool_slots.get((p.dag_id, p.pool, p.slot_index))
        if slot is None or slot["leased_by_task"] is not None:
            return
        if self._slot_of(p.task_id) is not None:  # pool_slots_task_idx: one slot per task
            raise ConstraintViolation(f"pool_slots_task_idx: task {p.task_id} holds a slot")
        slot.update(
            leased_by_task=p.task_id, leased_job=p.job, leased_at=self.now, leased_whole=p.whole
        )

    def release_slot(self, task_id: UUID) -> FreedSlot | None:
        slot = self._slot_of(task_id)
        if slot is None:
            return None
        freed = FreedSlot(
            PoolKey(slot["dag_id"], slot["pool"]), slot["leased_job"], slot["leased_whole"]
        )
        slot.update(leased_by_task=None, leased_job=None, leased_at=None, leased_whole=False)
        return freed

    def waiting_for_pool(self, key: PoolKey, skip_job: str | None = None) -> list[UUID]:
        slots = self._pool(key.dag_id, key.pool)
        leased: dict[str, int] = {}
        for slot in slots:
            if slot["leased_by_task"] is not None and slot["leased_job"] is not None:
                leased[slot["leased_job"]] = leased.get(slot["leased_job"], 0) + 1
        free = len(self._free_slots(slots))
        whole_held = self._whole_held(key.dag_id)
        waiting = [
            (s, r)
            for s, r in self._joined()
            if _eq(r["dag_id"], key.dag_id)
            and _eq(r["worker_pool"], key.pool)
            and s["status"] == "queued"
            and not s["cancel_requested"]
            and s["next_attempt_at"] <= self.now
            and (skip_job is None or s.get("whole_job") != skip_job)
            and not self._dag_paused(r["dag_id"])
        ]
        waiting.sort(key=lambda sr: sr[0]["updated_at"])  # stable: ties keep insertion order
        places: dict[str, int] = {}
        eligible: list[UUID] = []
        for s, r in waiting:
            # row_number() OVER (PARTITION BY job ORDER BY updated_at) <= the job's room
            places[r["job"]] = places.get(r["job"], 0) + 1
            limit = r["max_concurrency"] if r["max_concurrency"] is not None else 1
            room = limit - leased.get(r["job"], 0)
            if s.get("whole_job") is not None:  # held in any pool of the DAG: no room
                room = min(room, 1 - whole_held[s["whole_job"]])
            if places[r["job"]] <= room:
                eligible.append(s["task_id"])
        return eligible[:free]

    def waiting_for_job(self, dag_id: UUID, job: str) -> list[UUID]:
        if self._whole_held(dag_id)[job]:
            return []

        def can_claim(r: Row) -> bool:  # a free slot of its pool, within its max_concurrency
            usage = self.pool_usage(PoolJob(dag_id, r["worker_pool"], job))
            limit = r["max_concurrency"] if r["max_concurrency"] is not None else 1
            return usage["free_slot"] is not None and usage["job_running"] < limit

        waiting = [
            s
            for s, r in self._joined()
            if _eq(r["dag_id"], dag_id)
            and r["worker_pool"] is not None
            and _eq(s.get("whole_job"), job)
            and s["status"] == "queued"
            and not s["cancel_requested"]
            and s["next_attempt_at"] <= self.now
            and not self._dag_paused(r["dag_id"])
            and can_claim(r)
        ]
        waiting.sort(key=lambda s: s["updated_at"])  # stable: ties keep insertion order
        return [s["task_id"] for s in waiting[:1]]

    def slot_of_task(self, task_id: UUID) -> Row | None:
        slot = self._slot_of(task_id)
        return _pick(slot, ("pool", "slot_index", "env", "secrets")) if slot else None

    def slot_secret_values(self, task_id: UUID, org_id: UUID) -> list[Row]:
        slot = self._slot_of(task_id)
        if slot is None:
            return []
        # No secrets table: every name misses the LEFT JOIN, so its columns are all NULL
        # (org_id NULL: "not set") and legacy (`legacy_value IS NOT NULL`) is false.
        return [
            {
                "env_var": env_var,
                "name": _json_text(name),
                "org_id": None,
                "owner_user_id": None,
                "use_roles": None,
                "ciphertext": None,
                "legacy": False,
            }
            for env_var, name in sorted(slot["secrets"].items())
        ]

    def seal_legacy_secrets(self, vault: Any) -> int:
        return 0  # no secrets, so none stored before encryption

    def task_deployer(self, key: TaskKey) -> Row | None:
        return None  # no DAG versions or users

    # -- read access ------------------------------------------------------------------------
    def foreign_inputs(self, task_id: UUID) -> list[Row]:
        return []  # no producer DAGs for datasets

    def task_deployer_any_day(self, task_id: UUID) -> Row | None:
        return None  # no DAG versions or users

    # -- operator state ---------------------------------------------------------------------
    @staticmethod
    def _state_key(key: StateKey) -> tuple[UUID, UUID, str, int]:
        # Lineage: coalesce(since_version from dag_version_jobs, 0), and memory has no jobs.
        return (key.org_id, key.dag_id, key.job, 0)

    def operator_state(self, key: StateKey) -> Row | None:
        row = self._t.operator_state.get(self._state_key(key))
        return _pick(row, ("state", "revision")) if row is not None else None

    def lock_operator_state(self, key: StateKey) -> None:
        pass  # the store lock already serialises transactions

    def save_operator_state(self, key: StateKey, state: Any, task_id: UUID) -> None:
        k = self._state_key(key)
        row = self._t.operator_state.get(k)
        if row is not None:
            row.update(
                state=_jsonb(state),
                updated_by_task=task_id,
                updated_at=self.now,
                revision=row["revision"] + 1,
            )
            return
        self._t.operator_state[k] = {
            "org_id": key.org_id,
            "dag_id": key.dag_id,
            "job": key.job,
            "lineage": k[3],
            "state": _jsonb(state),
            "updated_by_task": task_id,
            "updated_at": self.now,
            "revision": 1,
        }

    # -- events, commits and reads ----------------------------------------------------------
    def insert_events(self, events: list[NewEvent]) -> list[UUID | None]:
        ids: list[UUID | None] = []
        for given in events:  # one at a time: a duplicate within the batch is a duplicate too
            e = replace(  # uuid columns cast text, as Postgres does
                given,
                event_id=_uuid(given.event_id),
                org_id=_uuid(given.org_id),
                task_id=_uuid(given.task_id),
                dataset_uuid=_uuid(given.dataset_uuid),
            )
            dedupe = (e.start_day, e.task_id, e.dataset_uuid, e.dedupe_key)
            if dedupe in self._t.event_keys:  # ON CONFLICT (...) DO NOTHING
                ids.append(None)
                continue
            pk = (e.start_day, e.event_id)
            if pk in self._t.events:  # not the arbiter: Postgres raises
                raise ConstraintViolation(f"events_pkey: event {e.event_id} exists")
            self._t.events[pk] = {
                "event_id": e.event_id,
                "start_day": e.start_day,
                "org_id": e.org_id,
                "producer_task_id": e.task_id,
                "producer_attempt": e.attempt,
                "dataset_uuid": e.dataset_uuid,
                "dedupe_key": e.dedupe_key,
                "cursor": e.cursor,
                "partition_key": e.partition_key,
                "range_start": e.range_start,
                "range_end": e.range_end,
                "payload": _jsonb(e.payload),
                "created_at": self.now,
            }
            self._t.event_keys[dedupe] = pk
            ids.append(e.event_id)
        return ids

    def tasks_for_event(
        self, *, org_id: UUID, producer: Row, event_id: UUID, event: EventIn, invalidates: bool
    ) -> list[tuple[TaskSpec, str]]:
        return []  # no DAG subscriptions in memory

    def insert_commit(self, c: NewCommit) -> str | None:
        # A version named by a task's outputs comes from JSON, as text: Postgres casts it.
        c = replace(
            c,
            commit_id=_uuid(c.commit_id),
            dataset_uuid=_uuid(c.dataset_uuid),
            dataset_version=_uuid(c.dataset_version),
            task_id=_uuid(c.task_id),
        )
        for h in (c.first_block_hash, c.last_block_hash, c.parent_hash):
            if h is not None and not _BLOCK_HASH.fullmatch(h):
                raise ConstraintViolation(f"dataset_commits hash check: {h!r}")
        key = (c.dataset_version, c.scope)
        old = self._t.dataset_commits.get(key)
        old_location = old["location"] if old is not None else None
        if old is not None:
            # ON CONFLICT DO UPDATE: commit_id, dataset_uuid, partition_key and the range stay.
            old.update(
                task_id=c.task_id,
                attempt=c.attempt,
                location=c.location,
                dag_version=c.dag_version,
                row_count=c.row_count,
                byte_count=c.byte_count,
                created_at=self.now,
                chain_id=c.chain_id,
                first_block_hash=c.first_block_hash,
                last_block_hash=c.last_block_hash,
                parent_hash=c.parent_hash,
            )
        else:
            if c.dataset_uuid not in self._t.datasets:
                raise ConstraintViolation(f"dataset_commits: no dataset {c.dataset_uuid}")
            if c.dataset_version not in self._t.dataset_versions:
                raise ConstraintViolation(f"dataset_commits: no version {c.dataset_version}")
            if any(r["commit_id"] == c.commit_id for r in self._t.dataset_commits.values()):
                raise ConstraintViolation(f"dataset_commits_pkey: commit {c.commit_id} exists")
            self._t.dataset_commits[key] = {
                "commit_id": c.commit_id,
                "dataset_uuid": c.dataset_uuid,
                "dataset_version": c.dataset_version,
                "task_id": c.task_id,
                "attempt": c.attempt,
                "scope": c.scope,
                "partition_key": c.partition_key,
                "range_start": c.range_start,
                "range_end": c.range_end,
                "location": c.location,
                "row_count": c.row_count,
                "byte_count": c.byte_count,
                "created_at": self.now,
                "dag_version": c.dag_version,
                "chain_id": c.chain_id,
                "first_block_hash": c.first_block_hash,
                "last_block_hash": c.last_block_hash,
                "parent_hash": c.parent_hash,
            }
        # A row comes back only when a location was replaced and so retired: the scope had a
        # non-null location distinct from the new one (and the dataset exists, the join's).
        ds = self._t.datasets.get(c.dataset_uuid)
        if old_location is None or old_location == c.location or ds is None:
            return None
        version = self._t.dataset_versions.get(c.dataset_version)
        self._t.retired_locations.append(
            {
                "id": next(self.store._retired_ids),
                "org_id": ds["org_id"],
                "backend": _coalesce(version["backend"] if version else None, ds["backend"]),
                "location": old_location,
                "reason": "superseded",
                "retired_at": self.now,
                "deleted_at": None,
            }
        )
        # The RETURNING sub-select: the version's strategy, else its dataset's (the version's
        # own dataset, joined by USING); NULL without a version row.
        if version is None:
            return None
        own = self._t.datasets.get(version["dataset_uuid"])
        if own is None:
            return None
        strategy: str | None = _coalesce(version["update_strategy"], own["update_strategy"])
        return strategy

    def existing_versions(self, versions: list[str]) -> set[str]:
        wanted = {_uuid(v) for v in versions}
        return {str(v) for v in self._t.dataset_versions if v in wanted}

    def output_strategies(self, versions: list[UUID]) -> list[Row]:
        wanted = {_uuid(v) for v in versions}
        rows: list[Row] = []
        for v in self._t.dataset_versions.values():
            d = self._t.datasets.get(v["dataset_uuid"])
            if v["dataset_version"] not in wanted or d is None:
                continue
            unique_key = _coalesce(v["unique_key"], d["unique_key"])
            rows.append(
                {
                    "dataset_version": v["dataset_version"],
                    "update_strategy": _coalesce(v["update_strategy"], d["update_strategy"]),
                    "unique_key": copy.deepcopy(unique_key),
                }
            )
        return rows

    def committed_reads(self, p: ReadsParams) -> list[Row]:
        scoped = {_uuid(v) for v in p.scoped}
        whole = {_uuid(v) for v in p.whole}
        appends = {_uuid(v) for v in p.appends}
        own = {_uuid(v) for v in p.own}

        def read(c: Row) -> bool:
            v, scope = c["dataset_version"], c["scope"]
            return (
                (v in scoped and _eq(scope, p.scope))
                or v in whole
                or (
                    v in appends
                    and p.scope is not None
                    and scope != p.scope
                    and _lt(c["range_start"], p.range_end)
                    and _lt(p.range_start, c["range_end"])
                )
                or (v in own and _eq(scope, p.scope))
            )

        rows = [
            c for c in self._t.dataset_commits.values() if c["location"] is not None and read(c)
        ]
        # Postgres sorts uuids by their bytes (as UUID compares) and text byte-wise (locale C).
        rows.sort(key=lambda c: (c["dataset_version"], c["scope"]))
        return [_pick(c, _COMMITTED_READ) for c in rows]
