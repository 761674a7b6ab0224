"""The state-store conformance suite (Dagster-style reusable storage tests): the task lifecycle
driven through the Dispatcher over each `StateStore`, so the Postgres store and its in-memory
twin are held to the same behaviour.

A backend's test module subclasses `StateStoreConformance` and provides a `harness` fixture: a
`Harness` that builds the Dispatcher over its store and does what a test needs done to the
store's world from outside (a DAG, a worker pool, a dataset version, time passing).
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol
from uuid import UUID

import pytest

from trace_platform.contract import (
    Claim,
    ClaimRequest,
    CompleteRequest,
    DatasetRef,
    EventIn,
    EventsRequest,
    HeartbeatRequest,
    LeaseRef,
    OutputCommit,
    RangeSpec,
    TaskSpec,
)
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.outbox import OutboxPublisher
from trace_platform.errors import Conflict, Forbidden, NotFound
from trace_platform.queue import payloads


class Harness(Protocol):
    dispatcher: Dispatcher

    def expire_lease(self, task_id: UUID) -> None:
        """The lease ran out a second ago (missed heartbeats)."""

    def expire_deadline(self, task_id: UUID) -> None:
        """The attempt's deadline (timeout_seconds) passed a second ago."""

    def make_claimable(self, task_id: UUID) -> None:
        """Its retry backoff is over."""

    def add_dag(self, name: str) -> UUID:
        """A DAG of the tasks' org (pool slots and operator state belong to one)."""

    def set_paused(self, dag_id: UUID, paused: bool) -> None: ...

    def add_pool(self, dag_id: UUID, pool: str, size: int) -> None: ...

    def add_dataset_version(self, dag_id: UUID, update_strategy: str) -> tuple[UUID, UUID]:
        """A dataset produced by the DAG and one version of it: (dataset_uuid, version)."""


class RecordingDriver:
    """The queue side of the outbox publisher: what it was asked to publish."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.sent: list[tuple[str, Any, int]] = []

    def publish_many(self, queue_name: str, bodies: list[Any], delay_seconds: int = 0) -> None:
        if self.fail:
            raise ConnectionError("queue is down")
        self.sent.extend((queue_name, b, delay_seconds) for b in bodies)


def spec(**kw: Any) -> TaskSpec:
    return TaskSpec(**{"job": "j", "operator": "noop", **kw})


def woken(d: Dispatcher) -> list[tuple[UUID, int]]:
    """The unsent wake-ups in the outbox: (task, delay seconds), oldest first."""
    with d.store.transaction() as tx:
        rows = tx.claim_pending(10_000)
    out = []
    for r in rows:
        msg = payloads.decode(r["payload"])
        assert isinstance(msg, payloads.TaskWakeup)
        out.append((msg.task_id, int(r["delay_seconds"])))
    return out


def lease(c: Claim) -> dict[str, Any]:
    return {"task_id": c.task_id, "attempt": c.attempt, "lease_token": c.lease_token}


def claim(d: Dispatcher, task_id: UUID, worker: str = "w1") -> Claim:
    return d.claim(ClaimRequest(task_id=task_id, worker_id=worker))


def complete(d: Dispatcher, c: Claim, outcome: str = "succeeded", **kw: Any) -> Any:
    return d.complete(CompleteRequest(**lease(c), outcome=outcome, **kw))


class StateStoreConformance:
    @pytest.fixture
    def d(self, harness: Harness) -> Dispatcher:
        return harness.dispatcher

    # -- intents and the outbox -------------------------------------------------------------
    def test_create_writes_the_task_and_its_wakeup(self, d: Dispatcher) -> None:
        ref = d.create_task(spec(config={"x": 1}))
        view = d.get_task(ref.task_id)
        assert (view.status, view.attempt, view.config) == ("queued", 0, {"x": 1})
        assert woken(d) == [(ref.task_id, 0)]
        buffered = d.create_task(spec(), status="buffered")
        assert d.get_task(buffered.task_id).status == "buffered"
        assert [t for t, _ in woken(d)] == [ref.task_id]  # a buffered task waits unwoken

    def test_publisher_sends_each_wakeup_once_and_keeps_them_when_the_queue_is_down(
        self, d: Dispatcher
    ) -> None:
        ids = [d.create_task(spec()).task_id for _ in range(3)]
        down = OutboxPublisher(d.store, RecordingDriver(fail=True))  # type: ignore[arg-type]
        assert down.publish_once() == 0
        assert down.pending() == 3
        up = RecordingDriver()
        pub = OutboxPublisher(d.store, up, batch_size=2)  # type: ignore[arg-type]
        assert pub.drain() == 3
        assert pub.pending() == 0 and pub.drain() == 0
        assert sorted(str(b["task_id"]) for _, b, _ in up.sent) == sorted(map(str, ids))

    def test_unknown_task_is_not_found(self, d: Dispatcher) -> None:
        with pytest.raises(NotFound):
            d.get_task(uuid.uuid4())
        with pytest.raises(NotFound):
            claim(d, uuid.uuid4())
        with pytest.raises(NotFound):
            d.cancel(uuid.uuid4())

    # -- claim, fetch, heartbeat ------------------------------------------------------------
    def test_claim_leases_once_and_opens_an_attempt(self, d: Dispatcher) -> None:
        ref = d.create_task(spec(config={"k": "v"}))
        c = claim(d, ref.task_id, "w1")
        assert c.attempt == 1 and c.slot is None
        with pytest.raises(Conflict) as e:
            claim(d, ref.task_id, "w2")
        assert e.value.code == "not_claimable" and "running (attempt 1)" in str(e.value)
        payload = d.fetch(LeaseRef(**lease(c)))
        assert (payload.status, payload.attempt, payload.config) == ("running", 1, {"k": "v"})
        view = d.get_task(ref.task_id)
        assert [(a.attempt, a.worker_id, a.outcome) for a in view.attempts] == [
            (1, "w1", "running")
        ]

    def test_heartbeat_extends_the_lease_and_keeps_progress(self, d: Dispatcher) -> None:
        c = claim(d, d.create_task(spec()).task_id)
        first = d.heartbeat(HeartbeatRequest(**lease(c)))
        second = d.heartbeat(HeartbeatRequest(**lease(c), progress={"rows": 5}))
        assert second.lease_until > first.lease_until >= c.lease_until
        assert (second.status, second.cancel_requested) == ("running", False)

    def test_a_wrong_token_or_stale_attempt_is_fenced_off(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        c1 = claim(d, d.create_task(spec()).task_id)
        forged = {**lease(c1), "lease_token": uuid.uuid4()}
        for call in (
            lambda: d.heartbeat(HeartbeatRequest(**forged)),
            lambda: d.fetch(LeaseRef(**forged)),
            lambda: d.complete(CompleteRequest(**forged, outcome="succeeded")),
        ):
            with pytest.raises(Conflict) as e:
                call()
            assert e.value.code == "wrong_lease"
        harness.expire_lease(c1.task_id)
        assert d.reap() == 1
        c2 = claim(d, c1.task_id, "w2")
        assert c2.attempt == 2
        with pytest.raises(Conflict) as e:
            complete(d, c1)
        assert e.value.code == "stale_attempt"
        assert complete(d, c2).status == "succeeded"

    # -- completion, retries and the budget ---------------------------------------------------
    def test_success_is_final_and_idempotent(self, d: Dispatcher) -> None:
        c = claim(d, d.create_task(spec()).task_id)
        assert complete(d, c).status == "succeeded"
        assert complete(d, c).status == "succeeded"  # the same report again
        with pytest.raises(Conflict) as e:
            complete(d, c, "failed", error="late")
        assert e.value.code == "task_finished"
        view = d.get_task(c.task_id)
        assert view.status == "succeeded" and view.attempts[0].outcome == "succeeded"

    def test_a_retryable_failure_backs_off_then_runs_again(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        ref = d.create_task(spec(retry_backoff_seconds=30, retry_backoff_max_seconds=30))
        woken(d)  # the first wake-up is not what this test looks at
        c1 = claim(d, ref.task_id)
        r = complete(d, c1, "failed", error="boom", retryable=True)
        assert r.status == "queued" and r.next_attempt_at is not None
        delays = [delay for t, delay in woken(d) if t == ref.task_id]
        assert delays[-1] >= 15  # jittered in [backoff/2, backoff], woken after it
        with pytest.raises(Conflict) as e:
            claim(d, ref.task_id)
        assert "backing off" in str(e.value)
        harness.make_claimable(ref.task_id)
        assert claim(d, ref.task_id).attempt == 2
        view = d.get_task(ref.task_id)
        assert [(a.outcome, a.error) for a in view.attempts] == [
            ("failed", "boom"),
            ("running", None),
        ]

    def test_the_last_allowed_failure_fails_the_task(self, d: Dispatcher) -> None:
        ref = d.create_task(spec(max_attempts=1))
        r = complete(d, claim(d, ref.task_id), "failed", error="bad input", retryable=True)
        assert r.status == "failed"
        view = d.get_task(ref.task_id)
        assert (view.status, view.last_error) == ("failed", "bad input")

    def test_a_permanent_failure_is_not_retried(self, d: Dispatcher) -> None:
        ref = d.create_task(spec(max_attempts=5))
        r = complete(d, claim(d, ref.task_id), "failed", error="nope", retryable=False)
        assert r.status == "failed"

    def test_a_released_attempt_costs_no_try(self, d: Dispatcher) -> None:
        ref = d.create_task(spec(max_attempts=1))
        r = complete(d, claim(d, ref.task_id), "released")
        assert r.status == "queued"
        c2 = claim(d, ref.task_id)  # at once: not backing off
        assert c2.attempt == 2
        assert complete(d, c2).status == "succeeded"
        outcomes = [a.outcome for a in d.get_task(ref.task_id).attempts]
        assert outcomes == ["released", "succeeded"]

    # -- the reaper ---------------------------------------------------------------------------
    def test_an_expired_lease_is_retried_at_once(self, d: Dispatcher, harness: Harness) -> None:
        ref = d.create_task(spec(retry_backoff_seconds=60, retry_backoff_max_seconds=60))
        woken(d)
        c = claim(d, ref.task_id)
        assert d.reap() == 0  # the lease holds
        harness.expire_lease(c.task_id)
        assert d.reap() == 1
        view = d.get_task(ref.task_id)
        assert view.status == "queued"
        assert view.attempts[0].outcome == "lease_expired"
        assert (ref.task_id, 0) in woken(d)
        assert claim(d, ref.task_id).attempt == 2  # no backoff: the worker failed, not the task

    def test_a_passed_deadline_times_out_and_ends_the_budget(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        ref = d.create_task(spec(max_attempts=1))
        claim(d, ref.task_id)
        harness.expire_deadline(ref.task_id)
        assert d.reap() == 1
        view = d.get_task(ref.task_id)
        assert view.status == "failed" and "exceeded its timeout" in (view.last_error or "")
        assert view.attempts[0].outcome == "timed_out"

    def test_a_stranded_queued_task_is_woken_again(self, d: Dispatcher) -> None:
        ref = d.create_task(spec())
        OutboxPublisher(d.store, RecordingDriver()).drain()  # type: ignore[arg-type]
        assert d.rewake(after_seconds=3600) == 0
        assert d.rewake(after_seconds=0) == 1
        assert woken(d) == [(ref.task_id, 0)]

    # -- cancel -------------------------------------------------------------------------------
    def test_cancel_queued_is_immediate_running_is_cooperative(self, d: Dispatcher) -> None:
        queued = d.create_task(spec())
        assert d.cancel(queued.task_id).status == "canceled"
        with pytest.raises(Conflict):
            claim(d, queued.task_id)
        c = claim(d, d.create_task(spec()).task_id)
        r = d.cancel(c.task_id)
        assert (r.status, r.cancel_requested) == ("running", True)
        assert d.heartbeat(HeartbeatRequest(**lease(c))).cancel_requested
        assert d.fetch(LeaseRef(**lease(c))).status == "canceled"
        assert complete(d, c, "canceled").status == "canceled"
        assert d.cancel(c.task_id).status == "canceled"  # again: nothing changes
        done = claim(d, d.create_task(spec()).task_id)
        complete(d, done)
        with pytest.raises(Conflict) as e:
            d.cancel(done.task_id)
        assert e.value.code == "task_finished"

    def test_a_failure_of_a_task_asked_to_cancel_ends_it_canceled(self, d: Dispatcher) -> None:
        c = claim(d, d.create_task(spec(max_attempts=5)).task_id)
        d.cancel(c.task_id)
        assert complete(d, c, "failed", error="stopped", retryable=True).status == "canceled"

    # -- DAGs: pause, worker-pool slots, operator state ---------------------------------------
    def test_a_paused_dags_tasks_wait_for_resume(self, d: Dispatcher, harness: Harness) -> None:
        dag = harness.add_dag("paused_dag")
        ref = d.create_task(spec(dag_id=dag, dag_version=1))
        harness.set_paused(dag, True)
        with pytest.raises(Conflict) as e:
            claim(d, ref.task_id)
        assert "'paused_dag' is paused" in str(e.value)
        harness.set_paused(dag, False)
        assert claim(d, ref.task_id).attempt == 1

    def test_pool_slots_bound_concurrency_and_a_freed_slot_wakes_the_next(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("pooled")
        harness.add_pool(dag, "rpc", 2)
        pooled = {"dag_id": dag, "dag_version": 1, "worker_pool": "rpc", "max_concurrency": 2}
        ids = [d.create_task(spec(**pooled)).task_id for _ in range(3)]
        first, second = claim(d, ids[0]), claim(d, ids[1])
        assert sorted([first.slot.slot_index, second.slot.slot_index]) == [0, 1]  # type: ignore[union-attr]
        with pytest.raises(Conflict) as e:
            claim(d, ids[2])
        assert e.value.code == "waiting_for_slot"
        view = d.get_task(ids[2])
        assert (view.status, view.attempt, view.attempts) == ("queued", 0, [])  # rolled back
        OutboxPublisher(d.store, RecordingDriver()).drain()  # type: ignore[arg-type]
        complete(d, first)
        assert [t for t, _ in woken(d)] == [ids[2]]
        assert claim(d, ids[2]).slot.slot_index == first.slot.slot_index  # type: ignore[union-attr]

    def test_max_concurrency_holds_a_job_back_and_the_wakeup_goes_to_another(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("fair")
        harness.add_pool(dag, "rpc", 3)
        a = {"dag_id": dag, "dag_version": 1, "worker_pool": "rpc", "max_concurrency": 1}
        a1, a2 = (d.create_task(spec(job="a", **a)).task_id for _ in range(2))
        c_a1 = claim(d, a1)
        with pytest.raises(Conflict) as e:
            claim(d, a2)
        assert "max_concurrency" in str(e.value)
        b = d.create_task(spec(job="b", **{**a, "max_concurrency": 2})).task_id
        c_b = claim(d, b)
        b2 = d.create_task(spec(job="b", **{**a, "max_concurrency": 2})).task_id
        OutboxPublisher(d.store, RecordingDriver()).drain()  # type: ignore[arg-type]
        complete(d, c_b)  # frees b's slot: b2 can use it, a2 cannot (a1 still runs)
        assert [t for t, _ in woken(d)] == [b2]
        complete(d, c_a1)
        assert a2 in [t for t, _ in woken(d)]

    def test_operator_state_is_saved_by_compare_and_set(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("stateful")
        job = spec(dag_id=dag, dag_version=1, job="agg", max_attempts=1)
        c1 = claim(d, d.create_task(job).task_id)
        c2 = claim(d, d.create_task(job).task_id)
        assert d.fetch(LeaseRef(**lease(c1))).operator_state_revision == 0
        assert complete(d, c1, operator_state={"n": 1}, operator_state_revision=0).status == (
            "succeeded"
        )
        # c2 read revision 0 too: it lost the race, runs again, and spends no try.
        r = complete(d, c2, operator_state={"n": 99}, operator_state_revision=0)
        assert r.status == "queued"
        assert d.get_task(c2.task_id).attempts[0].outcome == "state_conflict"
        harness.make_claimable(c2.task_id)  # it waits a jittered moment, to spread racers
        c3 = claim(d, c2.task_id)
        payload = d.fetch(LeaseRef(**lease(c3)))
        assert (payload.operator_state, payload.operator_state_revision) == ({"n": 1}, 1)
        assert complete(d, c3, operator_state={"n": 2}, operator_state_revision=1).status == (
            "succeeded"
        )

    # -- events and output commits ------------------------------------------------------------
    def test_events_are_deduplicated_and_only_for_own_outputs(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("emitter")
        ds, version = harness.add_dataset_version(dag, "append")
        out = DatasetRef(dataset_uuid=ds, dataset_version=version)
        c = claim(d, d.create_task(spec(dag_id=dag, dag_version=1, outputs=[out])).task_id)
        events = [EventIn(dataset_uuid=ds, cursor="1"), EventIn(dataset_uuid=ds, cursor="2")]
        first = d.events(EventsRequest(**lease(c), events=events))
        again = d.events(EventsRequest(**lease(c), events=events[1:]))
        assert (first.accepted, first.duplicates) == (2, 0)
        assert (again.accepted, again.duplicates) == (0, 1)
        stranger = EventIn(dataset_uuid=uuid.uuid4(), cursor="1")
        with pytest.raises(Forbidden, match="does not produce"):
            d.events(EventsRequest(**lease(c), events=[stranger]))
        r = complete(d, c, final_events=[EventIn(dataset_uuid=ds, cursor="3")])
        assert r.events_accepted == 1
        assert d.get_task(c.task_id).events == 3

    def test_a_commit_is_what_a_rerun_of_its_scope_reads(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("writer")
        ds, version = harness.add_dataset_version(dag, "replace")
        out = DatasetRef(dataset_uuid=ds, dataset_version=version)
        scope_event = {"dataset_uuid": str(ds), "range": {"start": 0, "end": 10}}
        task = spec(dag_id=dag, dag_version=1, outputs=[out], input_event=scope_event)
        c1 = claim(d, d.create_task(task).task_id)
        assert d.fetch(LeaseRef(**lease(c1))).committed == []
        commit = OutputCommit(dataset_uuid=ds, range=RangeSpec(start=0, end=10), location="a/1")
        assert complete(d, c1, outputs=[commit]).outputs_committed == 1
        c2 = claim(d, d.create_task(task).task_id)
        (held,) = d.fetch(LeaseRef(**lease(c2))).committed
        assert (held.scope, held.location, held.dataset_version) == (commit.scope, "a/1", version)
        assert d.fetch(LeaseRef(**lease(c2))).outputs[0].update_strategy == "replace"

    def test_a_commit_to_a_version_that_is_gone_lands_nothing(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("purged")
        ds, _ = harness.add_dataset_version(dag, "append")
        gone = DatasetRef(dataset_uuid=ds, dataset_version=uuid.uuid4())
        c = claim(d, d.create_task(spec(dag_id=dag, dag_version=1, outputs=[gone])).task_id)
        commit = OutputCommit(dataset_uuid=ds, location="x/1")
        r = complete(d, c, outputs=[commit], final_events=[EventIn(dataset_uuid=ds, cursor="1")])
        assert (r.status, r.events_accepted) == ("canceled", 0)
        assert "purged" in (d.get_task(c.task_id).last_error or "")
