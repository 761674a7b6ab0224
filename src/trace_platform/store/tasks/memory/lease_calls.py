"""The lease on the in-memory tables, as `db/sql/dispatcher.sql`'s queries do: claims,
heartbeats, completions, retries, cancels and the reaper's finds."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import TYPE_CHECKING
from uuid import UUID

from trace_platform.store.tasks.memory.tables import (
    _OUTCOMES,
    _UNTRIED,
    ConstraintViolation,
    _check_status,
    _eq,
    _jsonb,
    _limit,
    _lt,
    _pick,
)
from trace_platform.store.tasks.memory.tx_base import TxBase
from trace_platform.store.tasks.params import (
    AttemptEnd,
    ClaimManyParams,
    ClaimParams,
    HeartbeatParams,
    LeaseCheck,
    RetryParams,
    RunRetryParams,
    TaskKey,
)
from trace_platform.store.tasks.protocol import Row


class LeaseCalls(TxBase):
    """The lease: claimed, beaten, ended; what the reaper finds."""

    if TYPE_CHECKING:  # other sections' calls a batch claim makes (one MemoryTx has them all)

        def task_view(self, task_id: UUID) -> Row | None: ...

        def foreign_inputs(self, task_id: UUID) -> list[Row]: ...

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
            heartbeat_at=self.now,  # not updated_at: the last change of state (as Postgres's)
        )
        if p.progress is not None:  # none reported keeps the last one (and its time)
            s.update(progress=_jsonb(p.progress), progress_at=self.now)
        return _pick(s, ("status", "lease_until", "cancel_requested"))

    def heartbeat_many(self, beats: list[HeartbeatParams]) -> dict[UUID, Row]:
        return {b.task_id: row for b in beats if (row := self.heartbeat(b)) is not None}

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

    def request_cancel(self, task_ids: list[UUID]) -> dict[UUID, Row]:
        out = {}
        for task_id in task_ids:
            s = self._t.task_status.get(task_id)
            if s is None or s["status"] not in ("queued", "buffered", "running"):
                continue
            if s["status"] in ("queued", "buffered"):  # not started: canceled at once
                s.update(status="canceled", finished_at=self.now)
            s.update(cancel_requested=True, updated_at=self.now)
            out[task_id] = _pick(s, ("status", "cancel_requested"))
        return out

    def expired_leases(self, limit: int, leases: bool = True) -> list[Row]:
        now = self.now
        rows = [
            (s, r)
            for s, r in self._joined()
            if s["status"] == "running"
            and ((leases and _lt(s["lease_until"], now)) or _lt(s["deadline_at"], now))
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

    def revoke_worker_leases(self, worker_ids: list[str]) -> list[Row]:
        held = set(worker_ids)
        rows = sorted(
            (
                (s, r)
                for s, r in self._joined()
                if s["status"] == "running" and s["worker_id"] in held
            ),
            key=lambda sr: sr[0]["task_id"],
        )
        out = []
        for s, r in rows:
            s.update(lease_until=self.now, lease_token=None, updated_at=self.now)
            out.append(
                _pick(s, ("task_id", "start_day", "attempt", "cancel_requested", "worker_id"))
                | {"timed_out": False}
                | _pick(r, ("max_attempts", "retry_backoff_seconds", "retry_backoff_max_seconds"))
            )
        return out

    def untried_attempts(self, key: TaskKey) -> int:
        after = max(
            (
                r["after_attempt"]
                for r in self._t.task_retries.values()
                if r["task_id"] == key.task_id and r["start_day"] == key.start_day
            ),
            default=0,
        )
        return after + sum(
            1
            for a in self._t.task_attempts.values()
            if a["task_id"] == key.task_id
            and a["start_day"] == key.start_day
            and a["attempt"] > after
            and a["outcome"] in _UNTRIED
        )

    def retry_failed(self, p: RunRetryParams) -> list[Row]:
        failed = sorted(
            (
                (s, r)
                for s, r in self._joined()
                if r["run_id"] == p.run_id
                and p.first_day <= r["start_day"] <= p.last_day
                and r["dag_id"] == p.dag_id
                and r["dag_version"] == p.dag_version
                and s["status"] == "failed"
                and not s["cancel_requested"]
            ),
            key=lambda sr: sr[0]["task_id"],
        )
        out = []
        for s, r in failed:
            s.update(
                status="queued",
                lease_token=None,
                lease_until=None,
                finished_at=None,
                next_attempt_at=self.now,
                updated_at=self.now,
            )
            # ON CONFLICT DO NOTHING: a second retry after the same attempt keeps the first row.
            self._t.task_retries.setdefault(
                (s["task_id"], s["start_day"], s["attempt"]),
                {
                    "task_id": s["task_id"],
                    "start_day": s["start_day"],
                    "after_attempt": s["attempt"],
                    "run_id": p.run_id,
                    "retried_by": p.retried_by,
                    "created_at": self.now,
                },
            )
            out.append(_pick(s, ("task_id", "start_day", "attempt")) | _pick(r, ("job", "runtime")))
        return out

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
