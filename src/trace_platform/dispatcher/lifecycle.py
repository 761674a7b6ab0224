"""The task state machine: every transition is one Postgres transaction.

queued -> running(attempt n, lease) -> succeeded | failed | canceled; a failed or reaped attempt
goes back to queued with capped, jittered backoff until max_attempts. Each attempt ends with an
outcome: succeeded, failed, canceled, state_conflict (completion), lease_expired or timed_out
(reaper). Every wake-up is an outbox row written in the same transaction as the state change.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from trace_platform import faults
from trace_platform.config import Settings
from trace_platform.contract import (
    Claim,
    ClaimRequest,
    CompleteRequest,
    CompleteResponse,
    DatasetRef,
    HeartbeatRequest,
    HeartbeatResponse,
    IdempotencyContext,
    LeaseRef,
    SlotLease,
    TaskPayload,
)
from trace_platform.dispatcher import access, reads, state
from trace_platform.dispatcher.beats import HeartbeatBatcher
from trace_platform.dispatcher.commits import (
    Emitter,
    check_commits,
    commit_outputs,
    purged_outputs,
)
from trace_platform.dispatcher.fencing import check_lease, fenced, reject_finished, withdraw
from trace_platform.dispatcher.intents import Intents
from trace_platform.dispatcher.models import CancelResponse
from trace_platform.dispatcher.slots import Slots
from trace_platform.errors import (
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    ServerFault,
    TraceError,
)
from trace_platform.metrics.counters import DispatcherMetrics
from trace_platform.operators import WHOLE_OUTPUT_OPERATORS
from trace_platform.store.tasks import (
    AttemptEnd,
    ClaimManyParams,
    ClaimParams,
    HeartbeatParams,
    LeaseCheck,
    RetryParams,
    Row,
    RunRetryParams,
    StateStore,
    StoreTx,
)

log = logging.getLogger(__name__)
R = TypeVar("R")


def backoff_seconds(
    attempt: int, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Exponential in the attempt, capped, with jitter in [delay/2, delay] to spread retries."""
    delay = min(cap, base * (2 ** max(0, attempt - 1)))
    return (rng or random).uniform(delay / 2, delay)


def _lease_of(row: dict[str, Any]) -> LeaseRef:
    """The lease a claim row holds, as a fenced call would name it."""
    return LeaseRef(task_id=row["task_id"], attempt=row["attempt"], lease_token=row["lease_token"])


def _finish_attempt(
    tx: StoreTx, st: dict[str, Any], attempt: int, outcome: str, error: str | None
) -> None:
    tx.finish_attempt(
        AttemptEnd(
            task_id=st["task_id"],
            start_day=st["start_day"],
            attempt=attempt,
            outcome=outcome,
            error=error,
        )
    )


def _unique(task_ids: list[UUID], what: str) -> None:
    """A batch names each task once (a task's two reports in one batch could not both count)."""
    seen: set[UUID] = set()
    for task_id in task_ids:
        if task_id in seen:
            raise Invalid(f"task {task_id} appears twice in one {what} batch")
        seen.add(task_id)


class Lifecycle:
    # The operator-state compare-and-set, looked up on the class at each completion (a test
    # slows it down to hold many completions inside the race window at once).
    _state_moved = staticmethod(state.moved)

    def __init__(
        self,
        store: StateStore,
        settings: Settings,
        intents: Intents,
        slots: Slots,
        emitter: Emitter,
    ) -> None:
        self.store = store
        self.settings = settings
        self.intents = intents
        self.slots = slots
        self.emitter = emitter
        self.metrics = DispatcherMetrics()  # heartbeats and reaps, for /metrics
        self.beats = HeartbeatBatcher(self._write_heartbeats)

    # -- claim ---------------------------------------------------------------------------
    def claim_many(
        self, reqs: list[ClaimRequest], *, payload: bool = True
    ) -> list[Claim | TraceError]:
        """Claims a batch of wake-ups, answering for each in order: its Claim, or the error
        `claim` would raise for it. Plain tasks (no worker pool, no input of another DAG) are
        leased together, one statement and one commit for all of them; every other one goes
        the one-task way (`_claim_one`), each in its own transaction, so a refusal commits
        nothing but its own outcome."""
        _unique([r.task_id for r in reqs], "claim")
        with self.store.transaction() as tx:
            leased = self._lease_plain(tx, reqs, payload)
        return self._claimed(reqs, leased, payload)

    def exchange(
        self, completions: list[CompleteRequest], claims: list[ClaimRequest]
    ) -> tuple[list[CompleteResponse | TraceError], list[Claim | TraceError]]:
        """A worker's finished attempts and its next wake-ups, answered as `complete_many` and
        `claim_many` answer them. Reports with more to land than their success (events,
        outputs, state, a failure) go first, each the one-task way, so no claim's lease
        ticks while they run. Then the plain completions land and the plain claims are
        leased in one transaction (one commit for both, the completions first, so what they
        free is free for the claims); what that statement does not take goes the one-task
        way after it. The claim's statement never waits (SKIP LOCKED), so the completions'
        row locks, taken in task_id order, are the only ones it waits for: no lock-order
        deadlock is added. A failure of the claims' half is not the completions': they land
        on their own and each claim is answered for itself."""
        _unique([r.task_id for r in completions], "completion")
        _unique([r.task_id for r in claims], "claim")
        plain = self._plain_completions(completions)
        plain_ids = {r.task_id for r in plain}
        answers: dict[UUID, CompleteResponse | TraceError] = {
            r.task_id: _alone(r.task_id, lambda r=r: self._complete_full(r))
            for r in completions
            if r.task_id not in plain_ids
        }
        claim_fault: Exception | None = None
        done: set[UUID] = set()
        leased: dict[UUID, Claim] = {}
        # Completions alone are one statement: in autocommit, as complete_many lands them.
        opened = self.store.transaction if claims else self.store.statement
        try:
            if plain or claims:
                with opened() as tx:
                    done = self._complete_plain(tx, plain)
                    try:
                        leased = self._lease_plain(tx, claims, True)
                    except Exception as e:
                        claim_fault = e
                        raise
        except Exception:
            if claim_fault is None:
                raise
            log.warning("an exchange's claims failed (%r): each is claimed alone", claim_fault)
            with self.store.statement() as tx:
                done = self._complete_plain(tx, plain)
            leased = {}
        answers.update(zip([r.task_id for r in plain], self._completed(plain, done), strict=True))
        return [answers[r.task_id] for r in completions], self._claimed(claims, leased, True)

    def _lease_plain(
        self, tx: StoreTx, reqs: list[ClaimRequest], payload: bool
    ) -> dict[UUID, Claim]:
        """The batch statement's claims (the plain claimable tasks among `reqs`), by task."""
        if not reqs:
            return {}
        params = ClaimManyParams(
            task_ids=[r.task_id for r in reqs],
            worker_ids=[r.worker_id for r in reqs],
            lease=self.settings.lease_seconds,
            lease_tokens=[r.claim_id for r in reqs],
        )
        leased: dict[UUID, Claim] = {}
        views = tx.claim_many(params)
        strategies = reads.strategy_rows(tx, [v["outputs"] for v in views]) if payload else {}
        for view in views:
            task = self._payload_of(tx, view, None, strategies) if payload else None
            leased[view["task_id"]] = self._claim_of(view, task=task)
        return leased

    def _claim_of(
        self, row: dict[str, Any], slot: SlotLease | None = None, task: TaskPayload | None = None
    ) -> Claim:
        """The Claim of the lease `row` holds (a claim's, task_view's or task_status's row)."""
        lease = {
            k: row[k] for k in ("task_id", "start_day", "attempt", "lease_token", "lease_until")
        }
        return Claim(
            **lease, heartbeat_seconds=self.settings.heartbeat_seconds, slot=slot, task=task
        )

    def _claimed(
        self, reqs: list[ClaimRequest], leased: dict[UUID, Claim], payload: bool
    ) -> list[Claim | TraceError]:
        """Each request's answer: its batch claim, else the one-task way's (after the batch's
        commit)."""
        out: list[Claim | TraceError] = []
        for req in reqs:
            if req.task_id in leased:
                out.append(leased[req.task_id])
                continue
            out.append(_alone(req.task_id, lambda req=req: self._claim_one(req, payload=payload)))
        return out

    def claim(self, req: ClaimRequest, *, payload: bool = False) -> Claim:
        """One wake-up: leased by the batch statement of `claim_many` when it takes it (a
        plain task: one statement with the read-access and pool checks folded in, where the
        one-task way takes four), else the one-task way, which answers every case that
        statement leaves (a pooled task, a refusal, a retried claim: one empty statement more
        for those). Measured at 2 workers x 1 wrapper: 11-17 fewer context switches per task
        and about 0.2 ms less API CPU, since the store's plans are generic (its statement is
        no longer planned on every run)."""
        with self.store.transaction() as tx:
            leased = self._lease_plain(tx, [req], payload)
        if req.task_id in leased:
            return leased[req.task_id]
        return self._claim_one(req, payload=payload)

    def _claim_one(self, req: ClaimRequest, *, payload: bool = False) -> Claim:
        """Leases a queued task: one statement for a task without a worker pool; with one, the
        same statement plus a slot in one transaction (no slot, no claim). A task whose DAG
        may no longer read one of its inputs ends failed instead (403, naming it). With
        `payload`, the claim carries what `fetch` would answer, read in the same transaction
        (so under the lease it just took: the same fencing, one round trip fewer)."""
        params = ClaimParams(
            task_id=req.task_id,
            worker_id=req.worker_id,
            lease=self.settings.lease_seconds,
            pooled=False,
            lease_token=req.claim_id,
        )
        task: TaskPayload | None = None
        with self.store.transaction() as tx:
            refused = access.fail_if_refused(tx, req.task_id)
            row = None if refused else tx.claim(params)
            if row is not None and payload:
                task = self._payload(tx, _lease_of(row))
        if refused is not None:  # raised once the failure is committed
            raise Forbidden(f"task {req.task_id} cannot run: {refused}")
        if row is not None:
            return self._claim_of(row, task=task)
        with self.store.transaction() as tx:
            row = tx.claim(replace(params, pooled=True))
            if row is None:
                again = self._claimed_before(tx, req, payload)
                if again is not None:
                    return again
                raise self._not_claimable(tx, req.task_id)
            slot = self.slots.lease(tx, req.task_id)  # raises (rolling back the claim) if none
            if payload:
                task = self._payload(tx, _lease_of(row))
        return self._claim_of(row, slot=slot, task=task)

    def _claimed_before(self, tx: StoreTx, req: ClaimRequest, payload: bool) -> Claim | None:
        """The claim `req` already made, answered again: its request was retried (the first
        answer lost) with the same claim key, which its lease token is, by the same worker,
        and the lease is still that attempt's. None for anything else (refused as before)."""
        if req.claim_id is None:
            return None
        st = tx.status(req.task_id)
        if (
            st is None
            or st["status"] != "running"
            or st["lease_token"] != req.claim_id
            or st["worker_id"] != req.worker_id
        ):
            return None
        # Renewed as a heartbeat would (the first answer's lease may have run on meanwhile).
        lease = HeartbeatParams(
            task_id=st["task_id"],
            attempt=st["attempt"],
            lease_token=st["lease_token"],
            lease=self.settings.lease_seconds,
            progress=None,
        )
        renewed = tx.heartbeat(lease)
        if renewed is None:
            return None
        st = {**st, "lease_until": renewed["lease_until"]}
        slot = tx.slot_of_task(req.task_id)
        return self._claim_of(
            st,
            slot=SlotLease(pool=slot["pool"], slot_index=slot["slot_index"]) if slot else None,
            task=self._payload(tx, _lease_of(st)) if payload else None,
        )

    @staticmethod
    def _not_claimable(tx: StoreTx, task_id: UUID) -> Exception:
        st = tx.status(task_id)
        if st is None:
            return NotFound(f"task {task_id} does not exist")
        paused = tx.task_dag_paused(task_id)
        if st["status"] == "queued" and st["cancel_requested"]:
            reason = "cancel was requested"
        elif st["status"] == "queued" and paused is not None and paused["paused"]:
            reason = f"its DAG '{paused['name']}' is paused"
        elif st["status"] == "buffered":
            reason = "it is held until its DAG version's cutover"
        elif st["status"] == "queued":
            reason = f"it is backing off until {st['next_attempt_at'].isoformat()}"
        else:
            reason = f"it is {st['status']} (attempt {st['attempt']})"
        return Conflict(
            "not_claimable",
            f"task {task_id} cannot be claimed: {reason}",
            status=st["status"],
            attempt=st["attempt"],
        )

    # -- task-fetch and heartbeat -----------------------------------------------------------
    def fetch(self, ref: LeaseRef) -> TaskPayload:
        with self.store.transaction() as tx:
            return self._payload(tx, ref)

    def _payload(self, tx: StoreTx, ref: LeaseRef) -> TaskPayload:
        """What a worker needs to run the attempt `ref` holds (its lease checked first)."""
        view = check_lease(tx.task_view(ref.task_id), ref)
        return self._payload_of(tx, view, tx.slot_of_task(ref.task_id))

    def _payload_of(
        self,
        tx: StoreTx,
        view: dict[str, Any],
        slot: dict[str, Any] | None,
        strategies: dict[Any, dict[str, Any]] | None = None,
    ) -> TaskPayload:
        """The payload of a task_view row whose lease is the caller's, with its slot;
        `strategies`: its outputs' update strategies when already read (`reads.strategy_rows`)."""
        operator_state, revision = state.read(tx, view)
        outputs = reads.outputs_with_strategies(tx, view["outputs"], strategies)
        committed = reads.committed_reads(tx, view, outputs)
        status = "canceled" if view["cancel_requested"] else view["status"]
        return TaskPayload(
            task_id=view["task_id"],
            attempt=view["attempt"],
            start_day=view["start_day"],
            status=status,
            cancel_requested=view["cancel_requested"],
            org_id=view["org_id"],
            dag_id=view["dag_id"],
            dag_version=view["dag_version"],
            job=view["job"],
            operator=view["operator"],
            runtime=view["runtime"],
            config=view["config"],
            parent_task_id=view["parent_task_id"],
            input_event=view["input_event"],
            inputs=[DatasetRef(**r) for r in view["input_versions"]],
            outputs=outputs,
            run_id=view["run_id"],
            worker_pool=view["worker_pool"],
            slot_index=slot["slot_index"] if slot else None,
            slot_env=slot["env"] if slot else {},
            slot_secret_names=sorted(slot["secrets"]) if slot else [],
            operator_state=operator_state,
            operator_state_revision=revision,
            idempotency=IdempotencyContext(
                producer_task_id=view["task_id"], attempt=view["attempt"]
            ),
            committed=committed,
            timeout_seconds=view["timeout_seconds"],
            deadline_at=view["deadline_at"],
            lease_until=view["lease_until"],
            heartbeat_seconds=self.settings.heartbeat_seconds,
        )

    def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        params = HeartbeatParams(
            task_id=req.task_id,
            attempt=req.attempt,
            lease_token=req.lease_token,
            lease=self.settings.lease_seconds,
            progress=req.progress,
        )
        row = self.beats.beat(params)  # written with the others arriving meanwhile
        if row is not None:
            self.metrics.heartbeat(accepted=True)
            return HeartbeatResponse(**row)
        self.metrics.heartbeat(accepted=False)
        with self.store.transaction() as tx:  # refused: why, read on the locked row
            st = fenced(tx, req)
            raise Conflict(
                "lease_lost",
                f"attempt {req.attempt} of task {req.task_id} no longer holds its lease "
                f"(task is {st['status']})",
                status=st["status"],
            )

    def _write_heartbeats(self, beats: list[HeartbeatParams]) -> dict[UUID, dict[str, Any]]:
        """One statement, its own transaction: one round trip for a batch of heartbeats."""
        with self.store.statement() as tx:
            return tx.heartbeat_many(beats)

    # -- completion ----------------------------------------------------------------------
    @staticmethod
    def _plain_success(req: CompleteRequest) -> bool:
        """A success with nothing to land but itself: the one-statement path may take it."""
        return (
            req.outcome == "succeeded"
            and not req.final_events
            and not req.outputs
            and req.operator_state is None
        )

    def complete_many(self, reqs: list[CompleteRequest]) -> list[CompleteResponse | TraceError]:
        """Several completions, answering for each in order: its response, or the error
        `complete` would raise for it. Plain successes are fenced (each by its own attempt and
        lease token) and land together, one statement and one commit; every other report,
        and any plain one that statement did not take (stale, wrong lease, a slot held),
        goes the one-task way, each in its own transaction, so a refused one commits nothing."""
        _unique([r.task_id for r in reqs], "completion")
        plain = self._plain_completions(reqs)
        done: set[UUID] = set()
        if plain:
            with self.store.statement() as tx:  # one statement: its own transaction
                done = self._complete_plain(tx, plain)
        return self._completed(reqs, done)

    def _plain_completions(self, reqs: list[CompleteRequest]) -> list[CompleteRequest]:
        # An attempt number past the column's range names no attempt: the full path refuses it.
        return [r for r in reqs if self._plain_success(r) and r.attempt < 2**31]

    @staticmethod
    def _complete_plain(tx: StoreTx, plain: list[CompleteRequest]) -> set[UUID]:
        """The batch statement's completions (fenced, each by its own lease): the ids it took."""
        if not plain:
            return set()
        checks = [
            LeaseCheck(task_id=r.task_id, attempt=r.attempt, lease_token=r.lease_token)
            for r in plain
        ]
        faults.point("complete.before_commit")  # before: alone, its statement commits as it runs
        return tx.complete_fast_many(checks)

    def _completed(
        self, reqs: list[CompleteRequest], done: set[UUID]
    ) -> list[CompleteResponse | TraceError]:
        """Each report's answer: landed by the batch statement, else the one-task way's."""
        out: list[CompleteResponse | TraceError] = []
        for req in reqs:
            if req.task_id in done and self._plain_success(req):
                out.append(
                    CompleteResponse(task_id=req.task_id, attempt=req.attempt, status="succeeded")
                )
                continue
            out.append(_alone(req.task_id, lambda req=req: self._complete_full(req)))
        return out

    def complete(self, req: CompleteRequest) -> CompleteResponse:
        """Accepted only for the current attempt of a task not succeeded/canceled; a late
        report of the current attempt (after its lease expired) is accepted too."""
        if self._plain_success(req):
            fast = LeaseCheck(task_id=req.task_id, attempt=req.attempt, lease_token=req.lease_token)
            faults.point("complete.before_commit")  # its one statement commits as it runs
            with self.store.statement() as tx:
                if tx.complete_fast(fast):
                    return CompleteResponse(
                        task_id=req.task_id, attempt=req.attempt, status="succeeded"
                    )
        return self._complete_full(req)

    def _complete_full(self, req: CompleteRequest) -> CompleteResponse:
        """Any completion: the status row locked and fenced, then what it lands."""
        with self.store.transaction() as tx:
            tx.lock_task_dag_shared(req.task_id)
            st = fenced(tx, req)
            if st["status"] in ("succeeded", "canceled"):
                if st["status"] == req.outcome:  # the same report again: idempotent
                    return CompleteResponse(
                        task_id=req.task_id, attempt=req.attempt, status=st["status"]
                    )
                reject_finished(st, req)
            # What the operator reports is checked against what was assigned before anything
            # else: a forged commit is refused, never withdrawn or landed.
            checked = check_commits(st, req.attempt, req.outputs)
            req = withdraw(st, req, purged_outputs(tx, checked))
            req, conflict = self._compare_state(tx, st, req)
            req = self._superseded_whole(st, req)
            # Commits first: an event for a scope they rewrote is an invalidation.
            # A withdrawn or superseded report carries no outputs any more: it lands none.
            rewritten = commit_outputs(tx, st, req.attempt, checked if req.outputs else [])
            ids, dups, created = self.emitter.insert(
                tx, st, req.attempt, req.final_events, rewritten
            )
            self.slots.release(tx, req.task_id)
            status, next_at = self._settle(tx, st, req, conflict)
            faults.point("complete.before_commit")  # chaos: die mid-request, nothing committed
        return CompleteResponse(
            task_id=req.task_id,
            attempt=req.attempt,
            status=status,
            next_attempt_at=next_at,
            events_accepted=len(ids),
            events_duplicate=dups,
            tasks_created=created,
            outputs_committed=len(req.outputs),
        )

    def _compare_state(
        self, tx: StoreTx, st: dict[str, Any], req: CompleteRequest
    ) -> tuple[CompleteRequest, bool]:
        """A success that saves operator state, checked against the revision it read. If another
        run of the job saved since, nothing of this attempt lands (its report becomes a
        retryable failure with no events, outputs or state) and True says it lost the race."""
        if req.outcome != "succeeded" or req.operator_state is None:
            return req, False
        if st["dag_id"] is None:
            raise Invalid("operator state is kept per DAG job; this task has no DAG")
        if not self._state_moved(tx, st, req.operator_state_revision):
            return req, False
        lost = {
            "outcome": "failed",
            "retryable": True,
            "error": state.STATE_CONFLICT,
            "final_events": [],
            "outputs": [],
            "operator_state": None,
        }
        return req.model_copy(update=lost), True

    @staticmethod
    def _superseded_whole(st: dict[str, Any], req: CompleteRequest) -> CompleteRequest:
        """A whole-scope writer (dag/whole.py) runs one attempt at a time, holding its pool
        slot from claim to completion; an attempt the reaper ended gave its slot up, so
        another run may have read since and landed a newer output. Its late success lands
        nothing (read as a late failure, with no events, outputs or state): the reaper's
        outcome and the task's fate stand, and a retry reads again."""
        if (
            req.outcome != "succeeded"
            or st["status"] == "running"
            or st.get("operator") not in WHOLE_OUTPUT_OPERATORS
        ):
            return req
        late = {
            "outcome": "failed",
            "final_events": [],
            "outputs": [],
            "operator_state": None,
        }
        return req.model_copy(update=late)

    def _settle(
        self, tx: StoreTx, st: dict[str, Any], req: CompleteRequest, conflict: bool
    ) -> tuple[str, datetime | None]:
        """Ends the attempt with its outcome and moves the task on: the new status, and when
        a retry is next claimable."""
        if req.outcome == "succeeded":
            tx.set_succeeded(req.task_id)
            if req.operator_state is not None:
                state.save(tx, st, req.operator_state)
            _finish_attempt(tx, st, req.attempt, "succeeded", None)
            return "succeeded", None
        if req.outcome == "canceled":
            # A withdrawn success says why it landed nothing (see fencing.withdraw).
            tx.set_terminal(req.task_id, "canceled", req.error)
            _finish_attempt(tx, st, req.attempt, "canceled", req.error)
            return "canceled", None
        if st["status"] != "running":
            # A late hand-back or failure: the reaper already ended this attempt and decided
            # the task's fate. Its verdict stands (rewritten as `released` or `state_conflict`,
            # the attempt would stop counting as a try, and the task would gain one).
            return st["status"], None
        if req.outcome == "released":
            error = req.error or "handed back by its worker (shutting down)"
            _finish_attempt(tx, st, req.attempt, "released", error)
            if st["cancel_requested"]:
                tx.set_terminal(req.task_id, "canceled", error)
                return "canceled", None
            # Not the task's failure: queued again at once, and not one of its tries.
            return "queued", self._schedule_retry(tx, st, error, 0.0)
        error = req.error or "operator failed without a message"
        _finish_attempt(tx, st, req.attempt, state.OUTCOME if conflict else "failed", error)
        if conflict and not st["cancel_requested"]:
            # Someone else made progress: not this task's failure, so it costs no retry
            # budget and waits only a moment (jittered, so racers spread out).
            return "queued", self._schedule_retry(tx, st, error, random.uniform(0.05, 0.5))
        if req.retryable and not st["cancel_requested"] and state.tries_left(tx, st, req.attempt):
            return "queued", self._schedule_retry(tx, st, error)
        final = "canceled" if st["cancel_requested"] else "failed"
        tx.set_terminal(req.task_id, final, error)
        return final, None

    # -- retries and the reaper ----------------------------------------------------------
    def _schedule_retry(
        self, tx: StoreTx, st: dict[str, Any], error: str, delay: float | None = None
    ) -> datetime:
        if delay is None:
            delay = backoff_seconds(
                st["attempt"], st["retry_backoff_seconds"], st["retry_backoff_max_seconds"]
            )
        row = tx.set_retry(RetryParams(task_id=st["task_id"], error=error, backoff=delay))
        self.intents.wake(tx, st["task_id"], delay)
        return row["next_attempt_at"]

    def reap(self, limit: int = 100, leases: bool = True) -> int:
        """Fails attempts whose lease (unless `leases` is False) or deadline expired; retries
        or finishes their tasks. Safe to run in many processes at once (SKIP LOCKED)."""
        with self.store.transaction() as tx:
            rows = tx.expired_leases(limit, leases)
            for st in rows:
                self._end_lapsed(
                    tx,
                    st,
                    f"attempt {st['attempt']} exceeded its timeout"
                    if st["timed_out"]
                    else f"attempt {st['attempt']} lost its lease (missed heartbeats)",
                )
        for st in rows:  # counted once committed
            self.metrics.reaped.labels("timed_out" if st["timed_out"] else "lease_expired").inc()
        return len(rows)

    def fail_holders(self, tx: StoreTx, dead: dict[str, str]) -> int:
        """Ends, as a lapsed lease is ended, every running attempt of the workers in `dead`
        (worker id -> why the registry declared it dead), inside the caller's transaction (the
        one that declared them). Their lease tokens are cleared first: nothing those workers
        send for these attempts lands again (dispatcher/fleet.py)."""
        rows = tx.revoke_worker_leases(sorted(dead))
        for st in rows:
            why = dead[st["worker_id"]]
            self._end_lapsed(
                tx,
                st,
                f"attempt {st['attempt']} lost its worker {st['worker_id']}, declared dead: {why}",
            )
        return len(rows)

    def _end_lapsed(self, tx: StoreTx, st: dict[str, Any], error: str) -> None:
        """The reaper's ending of an attempt (`expired_leases`' row `st`): retried by the task's
        own policy, or ended failed (canceled, if that was asked)."""
        outcome = "timed_out" if st["timed_out"] else "lease_expired"
        _finish_attempt(tx, st, st["attempt"], outcome, error)
        self.slots.release(tx, st["task_id"])
        if st["cancel_requested"]:
            tx.set_terminal(st["task_id"], "canceled", error)
        elif state.tries_left(tx, st, st["attempt"]):
            # Attempts lost to a state race are not tries, here as on completion. A lost
            # lease is its worker's failure, not the task's: retried at once.
            self._schedule_retry(tx, st, error, None if st["timed_out"] else 0.0)
        else:
            tx.set_terminal(st["task_id"], "failed", error)

    # -- cancel --------------------------------------------------------------------------
    def cancel(
        self, task_id: UUID, then: Callable[[StoreTx, CancelResponse, bool], None] | None = None
    ) -> CancelResponse:
        """`then(tx, answer, changed)` runs in the cancel's transaction before it commits (the
        control plane's audit row); `changed` is False for a task canceled already."""
        with self.store.transaction() as tx:
            if (answer := self._cancel(tx, [task_id]).get(task_id)) is not None:
                if then is not None:
                    then(tx, answer, True)
                return answer
            st = tx.status(task_id)
            if st is None:
                raise NotFound(f"task {task_id} does not exist")
            if st["status"] == "canceled":
                answer = CancelResponse(task_id=task_id, status="canceled", cancel_requested=True)
                if then is not None:
                    then(tx, answer, False)
                return answer
            raise Conflict(
                "task_finished",
                f"task {task_id} already {st['status']}; it cannot be canceled",
                status=st["status"],
            )

    def cancel_many(self, task_ids: list[UUID]) -> dict[UUID, CancelResponse]:
        """`cancel` for many tasks in one transaction (a run's cancel, batch by batch): the
        answers of those this changed; a task finished or canceled already is left out."""
        with self.store.transaction() as tx:
            return self._cancel(tx, task_ids)

    def _cancel(self, tx: StoreTx, task_ids: list[UUID]) -> dict[UUID, CancelResponse]:
        rows = tx.request_cancel(task_ids)
        for task_id, row in rows.items():
            if row["status"] == "canceled":  # it was waiting: it may have been woken
                self.slots.canceled_waiting(tx, task_id)
        return {t: CancelResponse(task_id=t, **row) for t, row in rows.items()}

    # -- retry by hand -------------------------------------------------------------------
    def retry_run(
        self,
        p: RunRetryParams,
        check: Callable[[StoreTx], None] | None = None,
        then: Callable[[StoreTx, list[Row]], None] | None = None,
    ) -> list[Row]:
        """Queues again at once each task of run `p.run_id` that ended failed, with a fresh
        budget of tries (`retry_failed`), and wakes them all with one outbox statement: the
        rows retried. Under the DAG's change lock, shared as a completion takes it, so a
        cutover or rollback (exclusive) is wholly before or after: what `check(tx)` (the
        control plane's: paused, version live; it raises to refuse) saw holds for the
        re-queue. `then(tx, rows)` runs before the commit (the control plane's audit row)."""
        with self.store.transaction() as tx:
            tx.lock_dag_shared(p.dag_id)
            if check is not None:
                check(tx)
            rows = tx.retry_failed(p)
            self.intents.wake_many(tx, [(r["task_id"], r["runtime"]) for r in rows])
            if then is not None:
                then(tx, rows)
        return rows


def _alone(task_id: UUID, call: Callable[[], R]) -> R | TraceError:
    """One batch item on the one-task path: its refusal, or any other failure (logged, answered
    as a 500 for it alone), never the whole batch's."""
    try:
        return call()
    except TraceError as e:
        return e
    except Exception as e:
        log.exception("batch item for task %s failed", task_id)
        return ServerFault(f"task {task_id}: the server failed on it ({type(e).__name__})")
