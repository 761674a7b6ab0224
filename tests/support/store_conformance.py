"""The state-store conformance suite (Dagster-style reusable storage tests): the task lifecycle
driven through the Dispatcher over each `StateStore`, so the Postgres store and its in-memory
twin are held to the same behaviour.

A backend's test module subclasses `StateStoreConformance` and provides a `harness` fixture: a
`Harness` that builds the Dispatcher over its store and does what a test needs done to the
store's world from outside (a DAG, a worker pool, a dataset version, time passing).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

import psycopg
import pytest
from pydantic import ValidationError

from trace_platform import layout
from trace_platform.contract import (
    MAX_BACKOFF_SECONDS,
    MAX_CONFIG_BYTES,
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
from trace_platform.errors import Conflict, Forbidden, Invalid, NotFound
from trace_platform.queue import payloads
from trace_platform.store.tasks import RunRetryParams, StoreTx
from trace_platform.store.tasks.params import HeartbeatParams


def assigned(ds: UUID, version: UUID) -> DatasetRef:
    """A Parquet output as a deploy assigns it: the version and its prefix."""
    where = layout.version_location(uuid.UUID(int=1), ds, version, "parquet")
    return DatasetRef(dataset_uuid=ds, dataset_version=version, backend="parquet", location=where)


def own(
    out: DatasetRef, c: Claim, rng: RangeSpec | None = None, partition_key: str | None = None
) -> str:
    """The one location attempt `c` may commit for a scope of `out`."""
    assert out.location is not None
    return layout.scope_prefix(
        out.location, c.task_id, c.attempt, rng=rng, partition_key=partition_key
    )


class Harness(Protocol):
    dispatcher: Dispatcher

    def expire_lease(self, task_id: UUID) -> None:
        """The lease ran out a second ago (missed heartbeats)."""

    def expire_deadline(self, task_id: UUID) -> None:
        """The attempt's deadline (timeout_seconds) passed a second ago."""

    def make_claimable(self, task_id: UUID) -> None:
        """Its retry backoff is over."""

    def flag_cancel(self, task_id: UUID) -> None:
        """Its cancel asked, whatever its status (a finished task's flag no path of the
        lifecycle sets: a row as an older release or a hand in the database left it)."""

    def add_dag(self, name: str) -> UUID:
        """A DAG of the tasks' org (pool slots and operator state belong to one)."""

    def set_paused(self, dag_id: UUID, paused: bool) -> None: ...

    def add_pool(self, dag_id: UUID, pool: str, size: int) -> None: ...

    def retire_slots(self, dag_id: UUID, pool: str, keep: int) -> None:
        """As a deploy whose live version lists only `keep` slots of the pool (0: not it)."""

    def add_dataset_version(
        self, dag_id: UUID, update_strategy: str, unique_key: list[str] | None = None
    ) -> tuple[UUID, UUID]:
        """A dataset produced by the DAG and one version of it: (dataset_uuid, version)."""

    def retired_locations(self) -> list[str]:
        """The locations retired so far (superseded by a later commit of their scope)."""


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


def one_held_two_waiting(d: Dispatcher, harness: Harness, name: str) -> tuple[Claim, UUID, UUID]:
    """DAG `name` with a one-slot pool `a`: a task of it claimed (holding the slot), then two
    more queued behind it, their wake-ups sent."""
    dag = harness.add_dag(name)
    harness.add_pool(dag, "a", 1)
    pooled = {"dag_id": dag, "dag_version": 1, "job": "p", "worker_pool": "a"}
    held = claim(d, d.create_task(spec(**pooled)).task_id)
    t2, t3 = (d.create_task(spec(**pooled)).task_id for _ in range(2))
    sent(d)
    return held, t2, t3


def sent(d: Dispatcher) -> None:
    """Every wake-up the outbox holds now goes out (to no one): `woken` then shows only later
    ones."""
    OutboxPublisher(d.store, RecordingDriver()).drain()  # type: ignore[arg-type]


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


def _progress(d: Dispatcher, claims: list[Claim]) -> list[Any]:
    """Each task's last progress report, as its status row holds it."""
    with d.store.transaction() as tx:
        return [(tx.status(c.task_id) or {}).get("progress") for c in claims]


def _beat_or_error(d: Dispatcher) -> Callable[[HeartbeatRequest], Any]:
    def beat(req: HeartbeatRequest) -> Any:
        try:
            return d.heartbeat(req)
        except Conflict as e:
            return e

    return beat


def lease(c: Claim) -> dict[str, Any]:
    return {"task_id": c.task_id, "attempt": c.attempt, "lease_token": c.lease_token}


def claim(d: Dispatcher, task_id: UUID, worker: str = "w1") -> Claim:
    return d.claim(ClaimRequest(task_id=task_id, worker_id=worker))


def complete(d: Dispatcher, c: Claim, outcome: str = "succeeded", **kw: Any) -> Any:
    return d.complete(CompleteRequest(**lease(c), outcome=outcome, **kw))


def _two_runs_of_one_job(
    d: Dispatcher, harness: Harness, dag_name: str, max_attempts: int
) -> tuple[TaskSpec, Claim, Claim]:
    """A DAG job's spec, and two claimed tasks of it (they share its operator state)."""
    dag = harness.add_dag(dag_name)
    job = spec(dag_id=dag, dag_version=1, job="agg", max_attempts=max_attempts)
    return job, claim(d, d.create_task(job).task_id), claim(d, d.create_task(job).task_id)


def _reaped(d: Dispatcher, harness: Harness, c: Claim) -> Claim:
    """`c`'s lease run out and reaped: its task queued again, its attempt `lease_expired`."""
    harness.expire_lease(c.task_id)
    assert d.reap() == 1
    return c


def _failed(d: Dispatcher, harness: Harness, task_id: UUID, tries: int) -> Claim:
    """Fails each of the task's `tries` (retryable), the last for good: its last claim."""
    for n in range(tries):
        harness.make_claimable(task_id)
        c = claim(d, task_id)
        status = complete(d, c, "failed", error="boom", retryable=True).status
        assert status == ("failed" if n == tries - 1 else "queued")
    return c


def _retry_of(d: Dispatcher, run_id: UUID, dag_id: UUID, task_id: UUID) -> RunRetryParams:
    """The retry of run `run_id` (version 1 of `dag_id`), over the days of `task_id`."""
    day = d.get_task(task_id).start_day
    return RunRetryParams(
        run_id=run_id, dag_id=dag_id, dag_version=1, first_day=day, last_day=day, retried_by=None
    )


def _second_try_is_the_last(d: Dispatcher, task_id: UUID) -> None:
    """With max_attempts 2, the first attempt counted: the second's failure is final."""
    c2 = claim(d, task_id)
    assert complete(d, c2, "failed", error="boom", retryable=True).status == "failed"


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

    def test_a_lambda_task_is_woken_on_the_lambda_queue_alone(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """Its wake-ups, the first and a retry's, go to the queue only the Lambda invoker
        reads (docs/lambda.md): no platform worker is ever woken for it."""
        lam = d.create_task(spec(runtime="lambda", max_attempts=3)).task_id
        box = d.create_task(spec(max_attempts=3)).task_id

        def queues() -> dict[UUID, str]:
            up = RecordingDriver()
            OutboxPublisher(d.store, up).drain()  # type: ignore[arg-type]
            return {UUID(str(b["task_id"])): q for q, b, _ in up.sent}

        assert queues() == {lam: "lambda", box: "tasks"}
        for task_id in (lam, box):
            _reaped(d, harness, claim(d, task_id))  # retried: woken again
        assert queues() == {lam: "lambda", box: "tasks"}

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

    def test_a_claim_retried_with_its_key_is_answered_with_its_lease(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """The key becomes the lease token; the same claim again (its answer lost) gets that
        lease, renewed; any other claim, or the same after the attempt ended, is refused."""
        ids = [d.create_task(spec()).task_id for _ in range(3)]
        keys = [uuid.uuid4() for _ in ids]
        reqs = [
            ClaimRequest(task_id=t, worker_id="w1", claim_id=k)
            for t, k in zip(ids, keys, strict=True)
        ]
        one = d.claim(reqs[0], payload=True)
        many = d.claim_many(reqs[1:])
        assert [c.lease_token for c in [one, *many] if isinstance(c, Claim)] == keys
        harness.expire_lease(ids[0])
        again = d.claim(reqs[0], payload=True)
        assert (again.attempt, again.lease_token) == (1, keys[0])
        assert again.lease_until > one.lease_until and again.task is not None
        assert [c.attempt for c in d.claim_many(reqs[1:]) if isinstance(c, Claim)] == [1, 1]
        for other in (
            ClaimRequest(task_id=ids[0], worker_id="w2", claim_id=keys[0]),
            ClaimRequest(task_id=ids[0], worker_id="w1", claim_id=uuid.uuid4()),
            ClaimRequest(task_id=ids[0], worker_id="w1"),
        ):
            with pytest.raises(Conflict):
                d.claim(other)
        complete(d, again)
        with pytest.raises(Conflict):
            d.claim(reqs[0])

    def test_heartbeat_extends_the_lease_and_keeps_progress(self, d: Dispatcher) -> None:
        c = claim(d, d.create_task(spec()).task_id)
        first = d.heartbeat(HeartbeatRequest(**lease(c)))
        second = d.heartbeat(HeartbeatRequest(**lease(c), progress={"rows": 5}))
        assert second.lease_until > first.lease_until >= c.lease_until
        assert (second.status, second.cancel_requested) == ("running", False)

    def test_a_batch_of_heartbeats_extends_each_lease_it_holds_and_no_other(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """The group commit's statement: each heartbeat fenced by its own attempt and lease,
        a progress report replacing only its own task's, none reported keeping the last."""
        held = [claim(d, d.create_task(spec()).task_id) for _ in range(3)]
        d.heartbeat(HeartbeatRequest(**lease(held[1]), progress={"rows": 1}))
        lost = claim(d, d.create_task(spec()).task_id)
        complete(d, lost)
        beats = [
            HeartbeatParams(c.task_id, c.attempt, c.lease_token, 60.0, p)
            for c, p in zip(held, [{"rows": 7}, None, {"rows": 9}], strict=True)
        ]
        forged = HeartbeatParams(held[0].task_id, 1, uuid.uuid4(), 60.0, {"rows": 666})
        ended = HeartbeatParams(lost.task_id, lost.attempt, lost.lease_token, 60.0, None)
        with d.store.statement() as tx:
            rows = tx.heartbeat_many([*beats[1:], ended])
            rows_forged = tx.heartbeat_many([forged, beats[0]])
        assert set(rows) == {held[1].task_id, held[2].task_id}
        assert set(rows_forged) == {held[0].task_id}  # the forged one took nothing
        for c in held:
            got = {**rows, **rows_forged}[c.task_id]
            assert got["status"] == "running" and got["lease_until"] > c.lease_until
        assert _progress(d, held) == [{"rows": 7}, {"rows": 1}, {"rows": 9}]
        assert d.get_task(lost.task_id).status == "succeeded"

    def test_heartbeats_from_many_threads_each_land_or_are_refused_alone(
        self, d: Dispatcher
    ) -> None:
        """Concurrent heartbeats go together (HeartbeatBatcher): each caller gets its own
        task's answer, a wrong lease among them is refused alone, and a task beating twice at
        once is written once per heartbeat."""
        held = [claim(d, d.create_task(spec()).task_id) for _ in range(12)]
        forged = {**lease(held[0]), "lease_token": uuid.uuid4()}
        reqs = [HeartbeatRequest(**lease(c), progress={"i": i}) for i, c in enumerate(held)]
        reqs += [HeartbeatRequest(**lease(held[1]), progress={"i": 1})] * 3
        reqs.append(HeartbeatRequest(**forged))
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(_beat_or_error(d), reqs))
        assert all(a.status == "running" for a in answers[:-1]), answers
        assert isinstance(answers[-1], Conflict) and answers[-1].code == "wrong_lease"
        assert _progress(d, held) == [{"i": i} for i in range(12)]

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

    def test_a_batch_claims_each_task_or_says_why_not(self, d: Dispatcher) -> None:
        ids = [d.create_task(spec(config={"i": i})).task_id for i in range(3)]
        taken = claim(d, ids[2], "w0")
        unknown = uuid.uuid4()
        reqs = [ClaimRequest(task_id=t, worker_id=f"w{i}") for i, t in enumerate([*ids, unknown])]
        got = d.claim_many(reqs)
        assert [g.attempt for g in got[:2] if isinstance(g, Claim)] == [1, 1]
        assert [g.task.config for g in got[:2] if isinstance(g, Claim) and g.task] == [
            {"i": 0},
            {"i": 1},
        ]
        assert isinstance(got[2], Conflict) and got[2].code == "not_claimable"
        assert isinstance(got[3], NotFound)
        assert [a.worker_id for a in d.get_task(ids[1]).attempts] == ["w1"]
        with pytest.raises(Invalid):
            d.claim_many([reqs[0], reqs[0]])
        assert complete(d, taken).status == "succeeded"

    def test_tasks_made_together_are_made_as_one_by_one(self, d: Dispatcher) -> None:
        # create_tasks writes every task in one statement (dispatcher.sql insert_tasks): each
        # must equal a task made alone from the same spec, field by field, with its wake-up,
        # in order; a buffered one gets none.
        specs = [
            spec(config={"a": [1, {"b": None}], "big": 2**70}, input_event=None),
            spec(job="k", max_attempts=7, retry_backoff_seconds=1.5, input_event={"x": "y"}),
            spec(timeout_seconds=9, worker_pool="p", max_concurrency=2),
        ]
        woken(d)
        alone = [d.create_task(s).task_id for s in specs]
        woke_alone = [t for t, _ in woken(d)]
        refs = d.create_tasks([(s, "queued") for s in specs] + [(spec(), "buffered")])
        assert [r.status for r in refs] == ["queued"] * 3 + ["buffered"]
        made = [r.task_id for r in refs]
        assert len(set(made + alone)) == 7

        def same(view: Any) -> Any:
            x = view.model_dump()
            return {k: v for k, v in x.items() if not isinstance(v, datetime | UUID)}

        for one, together in zip(alone, made[:3], strict=True):
            assert same(d.get_task(together)) == same(d.get_task(one))
        assert d.get_task(made[0]).config == {"a": [1, {"b": None}], "big": 2**70}
        assert d.get_task(made[3]).status == "buffered"
        assert [t for t, _ in woken(d)] == woke_alone + made[:3]

    def test_tasks_made_together_are_all_or_none(self, d: Dispatcher) -> None:
        before = len(d.list_tasks(10_000))
        # The twin's ConstraintViolation is a ValueError; Postgres's a CheckViolation.
        with pytest.raises((ValueError, psycopg.errors.CheckViolation)):
            d.create_tasks([(spec(), "queued"), (spec(), "no such status")])
        assert len(d.list_tasks(10_000)) == before
        with pytest.raises(Invalid):
            d.create_tasks(
                [(spec(), "queued"), (spec(config={"x": "y" * MAX_CONFIG_BYTES}), "queued")]
            )
        assert len(d.list_tasks(10_000)) == before
        with pytest.raises(TypeError):  # not JSON: refused, as a one-task insert refuses it
            d.create_tasks([(spec(), "queued"), (spec(config={"at": datetime.now()}), "queued")])
        assert len(d.list_tasks(10_000)) == before
        assert d.create_tasks([]) == []

    def test_a_batch_claim_leaves_what_a_one_task_claim_leaves(self, d: Dispatcher) -> None:
        # claim_many's lease repeats the one-task claim's (dispatcher.sql): the two must leave
        # the same task, field by field (ids and times compared by kind only).
        alone, a, b = (d.create_task(spec()).task_id for _ in range(3))
        claim(d, alone, "w")
        got = d.claim_many([ClaimRequest(task_id=t, worker_id="w") for t in (a, b)])
        assert all(isinstance(g, Claim) for g in got)

        def kinds(x: Any) -> Any:
            if isinstance(x, dict):
                return {k: kinds(v) for k, v in x.items()}
            if isinstance(x, list):
                return [kinds(v) for v in x]
            if isinstance(x, datetime | UUID):
                return type(x).__name__
            return x

        one = kinds(d.get_task(alone).model_dump())
        assert one["status"] == "running" and one["attempts"]
        for t in (a, b):
            assert kinds(d.get_task(t).model_dump()) == one

    def test_a_batch_of_completions_is_fenced_task_by_task(self, d: Dispatcher) -> None:
        cs = [claim(d, d.create_task(spec()).task_id) for _ in range(4)]
        reqs = [
            CompleteRequest(**lease(cs[0]), outcome="succeeded"),
            CompleteRequest(**{**lease(cs[1]), "lease_token": uuid.uuid4()}, outcome="succeeded"),
            CompleteRequest(**{**lease(cs[2]), "attempt": 2}, outcome="succeeded"),
            CompleteRequest(**lease(cs[3]), outcome="failed", error="x", retryable=False),
        ]
        got = d.complete_many(reqs)
        assert not isinstance(got[0], Exception) and got[0].status == "succeeded"
        assert isinstance(got[1], Conflict) and got[1].code == "wrong_lease"
        assert isinstance(got[2], Conflict) and got[2].code == "stale_attempt"
        assert not isinstance(got[3], Exception) and got[3].status == "failed"
        statuses = [d.get_task(c.task_id).status for c in cs]
        assert statuses == ["succeeded", "running", "running", "failed"]
        assert d.get_task(cs[0].task_id).attempts[0].outcome == "succeeded"
        again = d.complete_many(reqs[:1])  # the same report again: idempotent
        assert not isinstance(again[0], Exception) and again[0].status == "succeeded"
        with pytest.raises(Invalid):
            d.complete_many([reqs[0], reqs[0]])

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

    def test_a_dead_workers_attempts_end_at_once_retried_and_fenced(self, d: Dispatcher) -> None:
        """The registry declared worker `dead` dead (dispatcher/fleet.py): its running attempts
        end as a lapsed lease does, whatever their leases say, and nothing it sends for them
        lands again; another worker's attempt runs on."""
        mine, other = (d.create_task(spec(max_attempts=2)).task_id for _ in range(2))
        c = claim(d, mine, worker="dead")
        kept = claim(d, other, worker="alive")
        with d.store.transaction() as tx:
            assert d.fail_holders(tx, {"dead": "no beat for 9 s"}) == 1
        view = d.get_task(mine)
        assert view.status == "queued" and view.attempts[0].outcome == "lease_expired"
        assert "lost its worker dead, declared dead: no beat for 9 s" in (view.last_error or "")
        assert d.get_task(other).status == "running"
        for late in ("succeeded", "failed"):  # a lapsed lease's own late report would land
            with pytest.raises(Conflict, match="lease token does not hold"):
                complete(d, c, late)
        with pytest.raises(Conflict):
            d.heartbeat(HeartbeatRequest(**lease(c)))
        assert d.get_task(mine).status == "queued"
        with d.store.transaction() as tx:  # nothing of it is left to end
            assert d.fail_holders(tx, {"dead": "again"}) == 0
        assert claim(d, mine).attempt == 2  # retried at once, by the task's own policy
        assert complete(d, kept).status == "succeeded"

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
        sent(d)
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

    # -- a run's retry by hand ----------------------------------------------------------------
    def test_a_retried_task_gets_a_fresh_budget_of_tries_and_its_old_attempts_land_nothing(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag, run = harness.add_dag("retried"), uuid.uuid4()
        task = d.create_task(spec(dag_id=dag, dag_version=1, run_id=run, max_attempts=2)).task_id
        last = _failed(d, harness, task, 2)
        sent(d)
        retry = _retry_of(d, run, dag, task)
        rows = d.retry_run(retry)
        assert [(r["task_id"], r["attempt"], r["job"], r["runtime"]) for r in rows] == [
            (task, 2, "j", "ecs_platform")
        ]
        assert woken(d) == [(task, 0)]
        assert (d.get_task(task).status, d.get_task(task).attempt) == ("queued", 2)
        with pytest.raises(Conflict) as e:  # its lease token cleared: a late report lands nothing
            complete(d, last)
        assert e.value.code == "wrong_lease"
        # Two tries again: the first failure after the retry is retried, the second is final.
        c3 = claim(d, task)
        assert c3.attempt == 3  # at once, not backing off
        assert complete(d, c3, "failed", error="again", retryable=True).status == "queued"
        assert _failed(d, harness, task, 1).attempt == 4
        # And retried by hand again: the budget counts from the latest retry.
        assert [(r["task_id"], r["attempt"]) for r in d.retry_run(retry)] == [(task, 4)]
        c5 = claim(d, task)
        assert c5.attempt == 5
        assert complete(d, c5, "failed", error="once more", retryable=True).status == "queued"

    def test_a_run_retry_requeues_and_wakes_its_failed_tasks_and_no_other(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """Only the run's own failed tasks of the version it fired, and not one whose cancel
        was asked (queued, no claim would ever take it); a refusal by `check` changes nothing;
        `then` sees the rows in the same transaction."""
        dag, run = harness.add_dag("half_failed"), uuid.uuid4()
        mine = {"dag_id": dag, "dag_version": 1, "run_id": run, "max_attempts": 1}
        a, b, asked, ok = (d.create_task(spec(**mine)).task_id for _ in range(4))
        other_run = d.create_task(spec(**{**mine, "run_id": uuid.uuid4()})).task_id
        other_version = d.create_task(spec(**{**mine, "dag_version": 2})).task_id
        for t in (a, b, asked, other_run, other_version):
            _failed(d, harness, t, 1)
        complete(d, claim(d, ok))
        harness.flag_cancel(asked)
        sent(d)
        retry = _retry_of(d, run, dag, a)

        def refuse(tx: StoreTx) -> None:
            raise Conflict("dag_paused", "paused")

        with pytest.raises(Conflict):
            d.retry_run(retry, check=refuse)
        assert d.get_task(a).status == "failed" and woken(d) == []

        seen: list[list[UUID]] = []
        rows = d.retry_run(retry, then=lambda tx, rows: seen.append([r["task_id"] for r in rows]))
        assert [r["task_id"] for r in rows] == sorted([a, b]) == seen[0]
        assert woken(d) == [(t, 0) for t in sorted([a, b])]
        statuses = {t: d.get_task(t).status for t in (a, b, asked, ok, other_run, other_version)}
        assert statuses == {
            a: "queued",
            b: "queued",
            asked: "failed",
            ok: "succeeded",
            other_run: "failed",
            other_version: "failed",
        }
        assert d.retry_run(retry) == []  # nothing failed any more

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
        sent(d)
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
        sent(d)
        complete(d, c_b)  # frees b's slot: b2 can use it, a2 cannot (a1 still runs)
        assert [t for t, _ in woken(d)] == [b2]
        complete(d, c_a1)
        assert a2 in [t for t, _ in woken(d)]

    def test_operator_state_is_saved_by_compare_and_set(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        job, c1, c2 = _two_runs_of_one_job(d, harness, "stateful", max_attempts=1)
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
        # the second save bumped the revision again: a new run reads it
        c4 = claim(d, d.create_task(job).task_id)
        payload = d.fetch(LeaseRef(**lease(c4)))
        assert (payload.operator_state, payload.operator_state_revision) == ({"n": 2}, 2)

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
        out = assigned(ds, version)
        scope_event = {"dataset_uuid": str(ds), "range": {"start": 0, "end": 10}}
        task = spec(dag_id=dag, dag_version=1, outputs=[out], input_event=scope_event)
        c1 = claim(d, d.create_task(task).task_id)
        assert d.fetch(LeaseRef(**lease(c1))).committed == []
        rng = RangeSpec(start=0, end=10)
        commit = OutputCommit(dataset_uuid=ds, range=rng, location=own(out, c1, rng))
        assert complete(d, c1, outputs=[commit]).outputs_committed == 1
        c2 = claim(d, d.create_task(task).task_id)
        (held,) = d.fetch(LeaseRef(**lease(c2))).committed
        assert (held.scope, held.location, held.dataset_version) == (
            commit.scope,
            commit.location,
            version,
        )
        assert d.fetch(LeaseRef(**lease(c2))).outputs[0].update_strategy == "replace"

    def test_a_commit_to_a_version_that_is_gone_lands_nothing(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("purged")
        ds, _ = harness.add_dataset_version(dag, "append")
        gone = assigned(ds, uuid.uuid4())
        c = claim(d, d.create_task(spec(dag_id=dag, dag_version=1, outputs=[gone])).task_id)
        commit = OutputCommit(dataset_uuid=ds, location=own(gone, c))
        r = complete(d, c, outputs=[commit], final_events=[EventIn(dataset_uuid=ds, cursor="1")])
        assert (r.status, r.events_accepted) == ("canceled", 0)
        assert "purged" in (d.get_task(c.task_id).last_error or "")

    # -- added by review: mutation killers --------------------------------------------------
    def test_released_attempts_do_not_count_against_the_budget(self, d: Dispatcher) -> None:
        ref = d.create_task(spec(max_attempts=2))
        assert complete(d, claim(d, ref.task_id), "released").status == "queued"
        c2 = claim(d, ref.task_id)
        assert c2.attempt == 2
        # attempt 2 is only the first try: a retryable failure is retried
        r = complete(d, c2, "failed", error="boom", retryable=True)
        assert r.status == "queued"

    def test_a_freed_slot_wakes_no_more_tasks_than_the_pool_has_free(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("limit")
        harness.add_pool(dag, "rpc", 2)
        pooled = {"dag_id": dag, "dag_version": 1, "worker_pool": "rpc", "max_concurrency": 5}
        ids = [d.create_task(spec(**pooled)).task_id for _ in range(4)]
        first = claim(d, ids[0])
        claim(d, ids[1])
        for t in ids[2:]:
            with pytest.raises(Conflict):
                claim(d, t)
        sent(d)
        complete(d, first)
        assert [t for t, _ in woken(d)] == [ids[2]]  # one free slot: one wake-up, the oldest

    def test_a_pool_shrunk_by_a_deploy_takes_no_task_on_its_retired_slots(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("shrunk")
        harness.add_pool(dag, "rpc", 2)
        pooled = {"dag_id": dag, "dag_version": 1, "worker_pool": "rpc", "max_concurrency": 5}
        ids = [d.create_task(spec(**pooled)).task_id for _ in range(3)]
        harness.retire_slots(dag, "rpc", 1)  # the live version lists one slot
        first = claim(d, ids[0])
        assert first.slot.slot_index == 0  # type: ignore[union-attr]
        with pytest.raises(Conflict) as e:  # slot 1 is free, but retired
            claim(d, ids[1])
        assert e.value.code == "waiting_for_slot"
        sent(d)
        complete(d, first)
        assert [t for t, _ in woken(d)] == [ids[1]]  # one slot: one wake-up
        assert claim(d, ids[1]).slot.slot_index == 0  # type: ignore[union-attr]

    def test_a_pool_a_deploy_dropped_still_serves_the_tasks_made_under_it(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """Tasks queued in a pool the live version no longer has are not stranded waiting for
        a slot that will never come: the pool's old slots serve them, as many at once."""
        dag = harness.add_dag("dropped")
        harness.add_pool(dag, "rpc", 2)
        pooled = {"dag_id": dag, "dag_version": 1, "worker_pool": "rpc", "max_concurrency": 5}
        ids = [d.create_task(spec(**pooled)).task_id for _ in range(3)]
        first = claim(d, ids[0])
        harness.retire_slots(dag, "rpc", 0)
        second = claim(d, ids[1])
        assert {first.slot.slot_index, second.slot.slot_index} == {0, 1}  # type: ignore[union-attr]
        with pytest.raises(Conflict) as e:  # still no more at once than the pool had
            claim(d, ids[2])
        assert e.value.code == "waiting_for_slot"
        sent(d)
        complete(d, second)
        assert [t for t, _ in woken(d)] == [ids[2]]
        assert claim(d, ids[2]).slot.slot_index == second.slot.slot_index  # type: ignore[union-attr]

    def test_a_whole_writer_runs_one_at_a_time_across_the_pools_of_its_dag(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """A deploy moved the job to pool `b` while a run held pool `a`'s slot: the run queued
        on `b` waits for it, and is woken by its release (which otherwise wakes only `a`'s)."""
        dag = harness.add_dag("moved")
        harness.add_pool(dag, "a", 1)
        harness.add_pool(dag, "b", 1)
        whole = {"dag_id": dag, "dag_version": 1, "job": "w", "operator": "sql_transform"}
        old = d.create_task(spec(**whole, worker_pool="a")).task_id
        new = d.create_task(spec(**{**whole, "dag_version": 2}, worker_pool="b")).task_id
        running = claim(d, old)
        with pytest.raises(Conflict) as e:
            claim(d, new)
        assert e.value.code == "waiting_for_slot"
        assert "job 'w' rewrites its output whole and runs one at a time" in str(e.value)
        sent(d)
        complete(d, running)
        assert [t for t, _ in woken(d)] == [new]
        assert claim(d, new).slot.pool == "b"  # type: ignore[union-attr]

    def test_a_job_made_a_whole_writer_does_not_wait_for_its_runs_under_another_operator(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """v1 ran job `w` as a plain operator in pool `a`; v2 makes it a whole writer on `b`.
        Only a whole writer's run holds the job back (one that did wait here was never woken:
        the plain run's release wakes only its own pool)."""
        dag = harness.add_dag("became_whole")
        harness.add_pool(dag, "a", 1)
        harness.add_pool(dag, "b", 1)
        plain = {"dag_id": dag, "dag_version": 1, "job": "w", "worker_pool": "a"}
        whole = {**plain, "dag_version": 2, "worker_pool": "b", "operator": "sql_transform"}
        claim(d, d.create_task(spec(**plain)).task_id)
        assert claim(d, d.create_task(spec(**whole)).task_id).slot.pool == "b"  # type: ignore[union-attr]

    def test_a_shared_pools_freed_slot_wakes_no_whole_writer_held_in_another_pool(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """Pool `b` is shared by whole writer `w` (moved there) and job `x`. While `w`'s old run
        holds pool `a`, `b`'s freed slot goes to `x`'s run, which can take it; `w`'s queued run
        is woken when its old run ends."""
        dag = harness.add_dag("shared")
        harness.add_pool(dag, "a", 1)
        harness.add_pool(dag, "b", 1)
        w = {"dag_id": dag, "job": "w", "operator": "sql_transform"}
        x = {"dag_id": dag, "dag_version": 2, "job": "x", "worker_pool": "b"}
        w_a = d.create_task(spec(**w, dag_version=1, worker_pool="a")).task_id
        x0 = d.create_task(spec(**x)).task_id
        w_b = d.create_task(spec(**w, dag_version=2, worker_pool="b")).task_id
        x1 = d.create_task(spec(**x)).task_id
        held = claim(d, w_a)
        ran = claim(d, x0)
        sent(d)
        complete(d, ran)
        assert [t for t, _ in woken(d)] == [x1]
        sent(d)
        ran = claim(d, x1)
        complete(d, held)
        assert [t for t, _ in woken(d)] == []  # its pool is full: `b`'s release wakes it
        sent(d)
        complete(d, ran)
        assert [t for t, _ in woken(d)] == [w_b]  # now it can run
        assert claim(d, w_b).slot.pool == "b"  # type: ignore[union-attr]

    def test_a_freed_slot_goes_to_a_job_that_can_take_it_not_a_held_back_whole_writer(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """Job `w`'s plain run (v1) holds a slot of pool `a`; its v2 whole run waits behind it
        (max_concurrency 1). The slot `x` frees goes to `x`'s next run, not to `w`'s."""
        dag = harness.add_dag("same_pool")
        harness.add_pool(dag, "a", 2)
        plain = {"dag_id": dag, "dag_version": 1, "job": "w", "worker_pool": "a"}
        whole = {**plain, "dag_version": 2, "operator": "sql_transform"}
        x = {"dag_id": dag, "dag_version": 2, "job": "x", "worker_pool": "a"}
        claim(d, d.create_task(spec(**plain)).task_id)
        ran = claim(d, d.create_task(spec(**x)).task_id)
        w2 = d.create_task(spec(**whole)).task_id
        x1 = d.create_task(spec(**x)).task_id
        with pytest.raises(Conflict):
            claim(d, w2)
        sent(d)
        complete(d, ran)
        assert [t for t, _ in woken(d)] == [x1]

    def test_a_whole_writers_release_wakes_one_run_of_its_job(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """Its runs wait in pools `a` and `b`: the release wakes the job's oldest run only (the
        other could not run beside it), and `a`'s freed slot also goes to `x`."""
        dag = harness.add_dag("one_wake")
        harness.add_pool(dag, "a", 1)
        harness.add_pool(dag, "b", 1)
        w = {"dag_id": dag, "job": "w", "operator": "sql_transform"}
        w1 = d.create_task(spec(**w, dag_version=1, worker_pool="a")).task_id
        w2 = d.create_task(spec(**w, dag_version=1, worker_pool="a")).task_id
        w3 = d.create_task(spec(**w, dag_version=2, worker_pool="b")).task_id
        x = d.create_task(spec(dag_id=dag, dag_version=2, job="x", worker_pool="a")).task_id
        held = claim(d, w1)
        sent(d)
        complete(d, held)
        assert sorted(t for t, _ in woken(d)) == sorted([x, w2])
        assert claim(d, w2).slot.pool == "a"  # type: ignore[union-attr]
        with pytest.raises(Conflict):
            claim(d, w3)

    def test_a_whole_writers_next_run_is_one_that_can_claim_now(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """The job's oldest run waits in pool `b`, full; a younger one in `a`, whose slot the
        release frees. The younger is woken: the older would be refused and `a` left idle."""
        dag = harness.add_dag("full_pool")
        harness.add_pool(dag, "a", 1)
        harness.add_pool(dag, "b", 1)
        w = {"dag_id": dag, "job": "w", "operator": "sql_transform"}
        held = claim(d, d.create_task(spec(**w, dag_version=1, worker_pool="a")).task_id)
        claim(d, d.create_task(spec(dag_id=dag, dag_version=1, job="y", worker_pool="b")).task_id)
        d.create_task(spec(**w, dag_version=2, worker_pool="b"))
        wa = d.create_task(spec(**w, dag_version=1, worker_pool="a")).task_id
        sent(d)
        complete(d, held)
        assert [t for t, _ in woken(d)] == [wa]
        assert claim(d, wa).slot.pool == "a"  # type: ignore[union-attr]

    def test_a_whole_writers_woken_run_canceled_wakes_the_next(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("cancel_woken")
        harness.add_pool(dag, "a", 1)
        harness.add_pool(dag, "b", 1)
        w = {"dag_id": dag, "job": "w", "operator": "sql_transform"}
        held = claim(d, d.create_task(spec(**w, dag_version=1, worker_pool="a")).task_id)
        w2 = d.create_task(spec(**w, dag_version=1, worker_pool="a")).task_id
        w3 = d.create_task(spec(**w, dag_version=2, worker_pool="b")).task_id
        sent(d)
        complete(d, held)
        assert [t for t, _ in woken(d)] == [w2]
        sent(d)
        d.cancel(w2)
        assert [t for t, _ in woken(d)] == [w3]

    def test_a_pooled_task_woken_then_canceled_wakes_the_next(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        """A release wakes as many tasks as the pool has free slots: one of them canceled before
        it claimed leaves its slot to the next (before: idle until the rewake)."""
        held, t2, t3 = one_held_two_waiting(d, harness, "cancel_woken_plain")
        complete(d, held)
        assert [t for t, _ in woken(d)] == [t2]
        sent(d)
        d.cancel(t2)
        assert [t for t, _ in woken(d)] == [t3]
        assert claim(d, t3).slot.pool == "a"  # type: ignore[union-attr]

    def test_other_jobs_of_one_name_in_two_pools_run_at_once(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("two_pools")
        harness.add_pool(dag, "a", 1)
        harness.add_pool(dag, "b", 1)
        job = {"dag_id": dag, "dag_version": 1, "job": "n"}
        first = claim(d, d.create_task(spec(**job, worker_pool="a")).task_id)
        second = claim(d, d.create_task(spec(**job, worker_pool="b")).task_id)
        assert (first.slot.pool, second.slot.pool) == ("a", "b")  # type: ignore[union-attr]

    def test_a_late_report_of_a_reaped_attempt_keeps_the_reapers_error(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        c = claim(d, d.create_task(spec(max_attempts=3)).task_id)
        harness.expire_lease(c.task_id)
        assert d.reap() == 1
        assert complete(d, c, "canceled").status == "canceled"  # no error of its own
        view = d.get_task(c.task_id)
        lost = "attempt 1 lost its lease (missed heartbeats)"
        assert view.last_error == lost  # coalesce(error, last_error)
        assert [(a.outcome, a.error) for a in view.attempts] == [("canceled", lost)]

    @pytest.mark.parametrize("late", ["released", "failed"])
    def test_a_late_hand_back_or_failure_leaves_the_reapers_verdict(
        self, d: Dispatcher, harness: Harness, late: str
    ) -> None:
        c = _reaped(d, harness, claim(d, d.create_task(spec(max_attempts=2)).task_id))
        # Rewritten as `released` the attempt would stop counting as a try: a third one.
        assert complete(d, c, late, error="late", retryable=True).status == "queued"
        lost = "attempt 1 lost its lease (missed heartbeats)"
        view = d.get_task(c.task_id)
        assert [(a.outcome, a.error) for a in view.attempts] == [("lease_expired", lost)]
        assert view.last_error == lost
        _second_try_is_the_last(d, c.task_id)

    def test_a_late_success_that_lost_the_state_race_leaves_the_reapers_verdict(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        _, late, other = _two_runs_of_one_job(d, harness, "late_state", max_attempts=2)
        assert complete(d, other, operator_state={"n": 1}).status == "succeeded"
        _reaped(d, harness, late)
        # Read at revision 0, another run saved since: a `state_conflict`, which is no try,
        # were it written over the reaper's outcome.
        assert complete(d, late, operator_state={"n": 9}).status == "queued"
        view = d.get_task(late.task_id)
        assert [a.outcome for a in view.attempts] == ["lease_expired"]
        _second_try_is_the_last(d, late.task_id)

    def test_rewake_skips_paused_and_backing_off_tasks(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("sleepy")
        d.create_task(spec(dag_id=dag, dag_version=1))
        harness.set_paused(dag, True)
        backing = d.create_task(spec(retry_backoff_seconds=60, retry_backoff_max_seconds=60))
        r = complete(d, claim(d, backing.task_id), "failed", error="x", retryable=True)
        assert r.status == "queued"
        sent(d)
        assert d.rewake(after_seconds=0) == 0

    def test_a_freed_slot_does_not_wake_a_paused_dags_tasks(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("paused_pool")
        harness.add_pool(dag, "rpc", 1)
        pooled = {"dag_id": dag, "dag_version": 1, "worker_pool": "rpc", "max_concurrency": 5}
        t1, t2 = (d.create_task(spec(**pooled)).task_id for _ in range(2))
        c1 = claim(d, t1)
        with pytest.raises(Conflict):
            claim(d, t2)
        sent(d)
        harness.set_paused(dag, True)
        complete(d, c1)
        assert woken(d) == []

    def test_a_freed_slot_does_not_wake_a_task_backing_off(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("backoff_pool")
        harness.add_pool(dag, "rpc", 2)
        pooled = {
            "dag_id": dag,
            "dag_version": 1,
            "worker_pool": "rpc",
            "max_concurrency": 5,
            "retry_backoff_seconds": 60,
            "retry_backoff_max_seconds": 60,
        }
        t1, t2 = (d.create_task(spec(**pooled)).task_id for _ in range(2))
        c1, c2 = claim(d, t1), claim(d, t2)
        assert complete(d, c2, "failed", error="x", retryable=True).status == "queued"
        sent(d)
        complete(d, c1)
        assert woken(d) == []  # t2 is not claimable yet; its own delayed wake-up was sent

    def test_a_reaped_attempt_is_reaped_once_and_loses_its_lease(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        c = claim(d, d.create_task(spec(max_attempts=3)).task_id)
        harness.expire_deadline(c.task_id)
        assert d.reap() == 1
        view = d.get_task(c.task_id)
        assert (view.status, view.lease_until) == ("queued", None)
        assert d.reap() == 0  # queued now: its passed deadline is not a running attempt's
        with pytest.raises(Conflict) as e:
            d.heartbeat(HeartbeatRequest(**lease(c)))
        assert e.value.code == "lease_lost"

    def test_a_late_success_does_not_revive_a_canceled_task(self, d: Dispatcher) -> None:
        c = claim(d, d.create_task(spec()).task_id)
        d.cancel(c.task_id)
        assert complete(d, c, "canceled").status == "canceled"
        with pytest.raises(Conflict) as e:
            complete(d, c)
        assert e.value.code == "task_finished"
        assert d.get_task(c.task_id).status == "canceled"

    def test_a_success_after_a_retried_failure_clears_the_error(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("recovering")
        ref = d.create_task(spec(dag_id=dag, dag_version=1, job="agg", max_attempts=3))
        complete(d, claim(d, ref.task_id), "failed", error="boom", retryable=True)
        assert d.get_task(ref.task_id).last_error == "boom"
        harness.make_claimable(ref.task_id)
        c2 = claim(d, ref.task_id)
        # operator state takes the full path (set_succeeded), not the one-statement success
        r = complete(d, c2, operator_state={"n": 1}, operator_state_revision=0)
        assert r.status == "succeeded"
        assert d.get_task(ref.task_id).last_error is None

    def test_events_are_deduplicated_per_dataset_and_counted_per_producer(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("two_outputs")
        ds1, v1 = harness.add_dataset_version(dag, "append")
        ds2, v2 = harness.add_dataset_version(dag, "append")
        outs = [
            DatasetRef(dataset_uuid=ds1, dataset_version=v1),
            DatasetRef(dataset_uuid=ds2, dataset_version=v2),
        ]
        task = spec(dag_id=dag, dag_version=1, outputs=outs)
        c1, c2 = claim(d, d.create_task(task).task_id), claim(d, d.create_task(task).task_id)
        same = [EventIn(dataset_uuid=ds1, cursor="1"), EventIn(dataset_uuid=ds2, cursor="1")]
        assert d.events(EventsRequest(**lease(c1), events=same)).accepted == 2
        assert d.events(EventsRequest(**lease(c2), events=same[:1])).accepted == 1
        assert (d.get_task(c1.task_id).events, d.get_task(c2.task_id).events) == (2, 1)

    def test_max_concurrency_counts_only_the_jobs_own_slots(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("per_job")
        harness.add_pool(dag, "rpc", 3)
        base = {"dag_id": dag, "dag_version": 1, "worker_pool": "rpc"}
        claim(d, d.create_task(spec(job="a", max_concurrency=1, **base)).task_id)
        b1, b2 = (d.create_task(spec(job="b", max_concurrency=2, **base)).task_id for _ in "12")
        claim(d, b1)
        assert claim(d, b2).slot is not None  # job a's slot is not job b's

    def test_purge_keeps_unsent_wakeups(self, d: Dispatcher) -> None:
        d.create_task(spec())
        pub = OutboxPublisher(d.store, RecordingDriver(), purge_after_seconds=0)  # type: ignore[arg-type]
        assert pub.purge_sent() == 0
        assert pub.pending() == 1
        assert pub.drain() == 1
        assert pub.purge_sent() == 1

    def test_a_whole_reader_reads_every_committed_scope_that_has_a_location(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("whole")
        ds, version = harness.add_dataset_version(dag, "append")
        out = assigned(ds, version)
        w = claim(d, d.create_task(spec(dag_id=dag, dag_version=1, outputs=[out])).task_id)
        p1, p2 = own(out, w, partition_key="p1"), own(out, w, partition_key="p2")
        commits = [
            OutputCommit(dataset_uuid=ds, partition_key="p1", location=p1),
            OutputCommit(dataset_uuid=ds, partition_key="p2", location=p2),
            OutputCommit(dataset_uuid=ds, partition_key="p3"),  # no location: nothing to read
        ]
        assert complete(d, w, outputs=commits).outputs_committed == 3
        reader = spec(dag_id=dag, dag_version=1, operator="sql_transform", input_versions=[out])
        r = claim(d, d.create_task(reader).task_id)
        got = d.fetch(LeaseRef(**lease(r))).committed
        assert [(c.scope, c.location) for c in got] == [("partition:p1", p1), ("partition:p2", p2)]

    def test_an_append_output_reads_only_the_scopes_overlapping_its_range(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("appender")
        ds, version = harness.add_dataset_version(dag, "append", unique_key=["id"])
        out = assigned(ds, version)
        w = claim(d, d.create_task(spec(dag_id=dag, dag_version=1, outputs=[out])).task_id)
        ranges = [RangeSpec(start=a, end=a + 10) for a in (0, 10, 20)]
        commits = [OutputCommit(dataset_uuid=ds, range=r, location=own(out, w, r)) for r in ranges]
        complete(d, w, outputs=commits)
        event = {"dataset_uuid": str(uuid.uuid4()), "range": {"start": 5, "end": 15}}
        task = spec(dag_id=dag, dag_version=1, outputs=[out], input_event=event)
        r = claim(d, d.create_task(task).task_id)
        got = d.fetch(LeaseRef(**lease(r))).committed
        assert [c.scope for c in got] == ["range:0-10", "range:10-20"]

    def test_a_rewritten_scope_retires_its_old_location_once(
        self, d: Dispatcher, harness: Harness
    ) -> None:
        dag = harness.add_dag("rewriter")
        ds, version = harness.add_dataset_version(dag, "replace")
        out = assigned(ds, version)
        task = spec(dag_id=dag, dag_version=1, outputs=[out])
        first = claim(d, d.create_task(task).task_id)
        complete(d, first, outputs=[OutputCommit(dataset_uuid=ds, location=own(out, first))])
        second = claim(d, d.create_task(task).task_id)
        again = OutputCommit(dataset_uuid=ds, location=own(out, second))
        complete(d, second, outputs=[again, again])  # its own location again replaces nothing
        assert harness.retired_locations() == [own(out, first)]

    # -- the commit boundary: what an operator reports is a claim, checked against what the
    # Dispatcher assigned (issue 38) -----------------------------------------------------------
    FORGED = (
        "another_version",
        "another_dataset_prefix",
        "the_org_prefix",
        "the_version_prefix",
        "the_range_prefix",
        "another_attempts_prefix",
        "another_range",
        "a_dotted_path",
        "a_postgres_table_outside_dataset_schemas",
        "another_versions_table",
        "an_event_pointing_elsewhere",
    )

    @pytest.mark.parametrize("forgery", FORGED)
    def test_a_forged_commit_is_refused_and_stores_nothing(
        self, d: Dispatcher, harness: Harness, forgery: str
    ) -> None:
        """Hostile operator code can send any commit: each shape that is not exactly the
        version, prefix or table the Dispatcher assigned this attempt is refused (403 naming
        the rule), and nothing of the completion lands."""
        dag = harness.add_dag("forger")
        ds, version = harness.add_dataset_version(dag, "replace")
        postgres = "table" in forgery
        out = assigned(ds, version)
        if postgres:
            table = layout.version_location(uuid.UUID(int=1), ds, version, "postgres")
            out = out.model_copy(update={"backend": "postgres", "location": table})
        rng = RangeSpec(start=0, end=10)
        event = {"dataset_uuid": str(ds), "range": {"start": 0, "end": 10}}
        task = spec(dag_id=dag, dag_version=1, outputs=[out], input_event=event)
        ref = d.create_task(task)
        if forgery == "another_attempts_prefix":  # a first try failed: this is attempt 2
            complete(d, claim(d, ref.task_id), "failed", error="once", retryable=True)
            harness.make_claimable(ref.task_id)
        c = claim(d, ref.task_id)
        mine = own(out, c, rng) if not postgres else str(out.location)
        base = str(out.location)
        victim = uuid.uuid4()
        location = {
            "another_version": mine,
            "another_dataset_prefix": f"org/{uuid.UUID(int=1)}/dataset/{victim}/version/{victim}/",
            "the_org_prefix": f"org/{uuid.UUID(int=1)}/dataset/",
            "the_version_prefix": base,
            "the_range_prefix": layout.range_prefix(base, 0, 10),
            "another_attempts_prefix": layout.attempt_prefix(
                layout.range_prefix(base, 0, 10), c.task_id, c.attempt - 1
            ),
            "another_range": own(out, c, RangeSpec(start=10, end=20)),
            "a_dotted_path": f"{base}range=0000000000-0000000010/t={c.task_id}.{c.attempt}/../",
            "a_postgres_table_outside_dataset_schemas": "public.api_keys",
            "another_versions_table": f"dataset_{ds.hex}.v_{victim.hex}",
            "an_event_pointing_elsewhere": mine,
        }[forgery]
        commit = OutputCommit(
            dataset_uuid=ds,
            dataset_version=victim if forgery == "another_version" else None,
            range=rng,
            location=location,
        )
        events = [EventIn(dataset_uuid=ds, range=rng, payload={"location": mine})]
        if forgery == "an_event_pointing_elsewhere":
            events = [EventIn(dataset_uuid=ds, range=rng, payload={"location": base})]
        with pytest.raises(Forbidden, match=r"writes only its assigned|may commit"):
            complete(d, c, outputs=[commit], final_events=events)
        view = d.get_task(c.task_id)
        assert (view.status, view.events) == ("running", 0)
        assert harness.retired_locations() == []
        again = claim(d, d.create_task(task).task_id)  # a reader of the scope finds nothing
        assert d.fetch(LeaseRef(**lease(again))).committed == []
        # The task's own, exact commit still lands (the check is not a blanket refusal).
        exact = commit.model_copy(update={"dataset_version": None, "location": mine})
        good = [EventIn(dataset_uuid=ds, range=rng, payload={"location": mine})]
        if postgres:
            good = [EventIn(dataset_uuid=ds, range=rng)]
        assert complete(d, c, outputs=[exact], final_events=good).outputs_committed == 1

    # -- added by review: values Postgres refuses (the twin does not check them) -------------
    def test_text_with_a_nul_is_refused(self, d: Dispatcher) -> None:
        ref = d.create_task(spec())
        with pytest.raises(Exception):  # noqa: B017 - psycopg.DataError on Postgres
            claim(d, ref.task_id, worker="w\x00")
        assert d.get_task(ref.task_id).status == "queued"

    def test_jsonb_normalises_object_key_order(self, d: Dispatcher) -> None:
        ref = d.create_task(spec(config={"zz": 1, "a": {"yy": 2, "b": 3}}))
        config = d.get_task(ref.task_id).config
        assert list(config) == ["a", "zz"] and list(config["a"]) == ["b", "yy"]

    # -- added by review: the longest backoff a spec may ask for still requeues ---------------
    def test_the_longest_retry_backoff_still_requeues(self, d: Dispatcher) -> None:
        longest = MAX_BACKOFF_SECONDS
        with pytest.raises(ValidationError):  # a clear 422 before anything is stored
            spec(retry_backoff_seconds=longest + 1)
        with pytest.raises(ValidationError):
            spec(max_concurrency=2**31)
        ref = d.create_task(
            spec(max_attempts=3, retry_backoff_seconds=longest, retry_backoff_max_seconds=longest)
        )
        woken(d)
        r = complete(d, claim(d, ref.task_id), "failed", error="x", retryable=True)
        assert r.status == "queued"
        (delay,) = [s for t, s in woken(d) if t == ref.task_id][-1:]
        assert longest / 2 <= delay <= longest
