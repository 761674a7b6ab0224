"""The task lifecycle as a state machine (hypothesis), against the real database: random
interleavings of create, claim, heartbeat, complete (every outcome), late and stale reports,
cancel, reaped leases and pool-slot churn never break the lifecycle's invariants, checked after
every step and, in full (tests/support/invariants.py), at the end of every run."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tests.support.dags import admin
from tests.support.invariants import assert_invariants, expire_lease
from trace_platform.contract import (
    Claim,
    ClaimRequest,
    CompleteRequest,
    HeartbeatRequest,
    TaskSpec,
)
from trace_platform.errors import Conflict, NotFound
from trace_platform.services import Services

POOLED = (
    "name: machine\nworker_pools: {rpc: [{}, {}]}\n"
    "jobs:\n  p: {operator: noop, worker_pool: rpc, scaling: {max_concurrency: 2}, max_attempts: 3}"
)
OUTCOMES = ("succeeded", "failed", "canceled", "released")
TABLES = (
    "task_registry",
    "task_status",
    "task_attempts",
    "events",
    "outbox",
    "queue_messages",
    "queue_leases",
    "queue_dead",
)


def _ref(c: Claim) -> dict[str, Any]:
    return {"task_id": c.task_id, "attempt": c.attempt, "lease_token": c.lease_token}


class Lifecycle(RuleBasedStateMachine):
    svc: Services

    tasks = Bundle("tasks")
    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.mine: set[uuid.UUID] = set()

    @initialize()
    def deploy(self) -> None:
        # Every run starts from no tasks (hypothesis replays a failing run: it must not depend
        # on what earlier runs left behind).
        # DELETE, not TRUNCATE: the tables hold a run's few rows, and TRUNCATE's new files per
        # table took ~0.1 s a run, a fifth of the test (no foreign keys or delete triggers here).
        with self.svc.pool.connection() as conn:
            for table in TABLES:
                conn.execute(f"DELETE FROM {table}")
            conn.execute(
                "UPDATE pool_slots SET leased_by_task = NULL, leased_job = NULL, leased_at = NULL"
            )
        self.svc.control.deploy(admin(self.svc), POOLED)

    def _q(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        with self.svc.pool.connection() as conn:
            return conn.execute(sql, args).fetchall()  # type: ignore[arg-type]

    def _status(self, task_id: uuid.UUID) -> dict[str, Any]:
        return self._q("SELECT * FROM task_status WHERE task_id = %s", task_id)[0]

    # -- rules ---------------------------------------------------------------------------------
    @rule(target=tasks, attempts=st.integers(1, 3))
    def create(self, attempts: int) -> uuid.UUID:
        ref = self.svc.dispatcher.create_task(
            TaskSpec(job="m", operator="noop", max_attempts=attempts, retry_backoff_seconds=0)
        )
        self.mine.add(ref.task_id)
        return ref.task_id

    @rule(target=tasks)
    def create_pooled(self) -> uuid.UUID:
        (task_id,) = self.svc.control.trigger(admin(self.svc), "machine")["tasks"]
        self.mine.add(task_id)
        return task_id  # type: ignore[no-any-return]

    @rule(target=claims, task_id=tasks)
    def claim(self, task_id: uuid.UUID) -> Claim | None:
        before = self._status(task_id)
        try:
            c = self.svc.dispatcher.claim(ClaimRequest(task_id=task_id, worker_id="w"))
        except Conflict:
            assert before["status"] != "queued" or before["next_attempt_at"] is not None
            return None
        assert before["status"] == "queued" and c.attempt == before["attempt"] + 1
        return c

    @rule(c=claims)
    def heartbeat(self, c: Claim | None) -> None:
        if c is None:
            return
        try:
            hb = self.svc.dispatcher.heartbeat(HeartbeatRequest(**_ref(c), progress={"n": 1}))
        except Conflict:
            st_ = self._status(c.task_id)
            assert st_["attempt"] != c.attempt or st_["status"] != "running"
            return
        assert hb.status == "running"

    @rule(c=consumes(claims), outcome=st.sampled_from(OUTCOMES), retryable=st.booleans())
    def complete(self, c: Claim | None, outcome: str, retryable: bool) -> None:
        if c is None:
            return
        before = self._status(c.task_id)
        try:
            res = self.svc.dispatcher.complete(
                CompleteRequest(**_ref(c), outcome=outcome, retryable=retryable)  # type: ignore[arg-type]
            )
        except Conflict as e:
            # Refused only for an older attempt, or a task already finished another way.
            assert e.code in ("stale_attempt", "task_finished", "wrong_lease"), e.code
            assert before["attempt"] != c.attempt or before["status"] in ("succeeded", "canceled")
            return
        assert before["attempt"] == c.attempt
        if before["status"] == "running" and outcome == "succeeded":
            assert res.status == "succeeded"
        if outcome == "released" and before["status"] == "running":
            assert res.status in ("queued", "canceled")

    @rule(c=claims)
    def stale_report(self, c: Claim | None) -> None:
        """A report for an attempt after a newer one started is always refused."""
        if c is None:
            return
        current = self._status(c.task_id)["attempt"]
        if current == c.attempt:
            return
        with pytest.raises(Conflict) as e:
            self.svc.dispatcher.complete(CompleteRequest(**_ref(c), outcome="succeeded"))
        assert e.value.code == "stale_attempt"

    @rule(task_id=tasks)
    def cancel(self, task_id: uuid.UUID) -> None:
        try:
            self.svc.dispatcher.cancel(task_id)
        except (Conflict, NotFound):
            assert self._status(task_id)["status"] in ("succeeded", "failed")

    @rule(task_id=tasks)
    def lose_lease(self, task_id: uuid.UUID) -> None:
        """Its worker died: the lease runs out and the reaper takes the attempt."""
        if self._status(task_id)["status"] != "running":
            return
        expire_lease(self.svc, task_id)
        assert self.svc.dispatcher.reap() >= 1
        assert self._status(task_id)["status"] in ("queued", "failed", "canceled")

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def one_running_attempt_per_running_task(self) -> None:
        rows = self._q(
            """SELECT s.task_id, s.status, s.attempt,
                      count(*) FILTER (WHERE a.outcome = 'running') AS running
               FROM task_status s LEFT JOIN task_attempts a USING (task_id)
               GROUP BY s.task_id, s.status, s.attempt"""
        )
        for r in rows:
            assert r["running"] == (1 if r["status"] == "running" else 0), r

    @invariant()
    def slots_held_only_by_running_tasks_within_the_pool(self) -> None:
        held = self._q(
            """SELECT p.leased_by_task, s.status FROM pool_slots p
               LEFT JOIN task_status s ON s.task_id = p.leased_by_task
               WHERE p.leased_by_task IS NOT NULL"""
        )
        assert all(h["status"] == "running" for h in held), held
        assert len(held) <= 2
        running_pooled = self._q(
            """SELECT count(*) AS n FROM task_status s JOIN task_registry r USING (task_id)
               WHERE s.status = 'running' AND r.worker_pool IS NOT NULL"""
        )[0]["n"]
        assert running_pooled == len(held)

    @invariant()
    def tries_within_budget(self) -> None:
        """Attempts that count (not state conflicts, not handed back) never exceed
        max_attempts; a failed task used them all or was not retryable."""
        rows = self._q(
            """SELECT s.task_id, r.max_attempts,
                      count(a.*) FILTER (WHERE a.outcome NOT IN ('state_conflict', 'released'))
                        AS tries
               FROM task_status s JOIN task_registry r USING (task_id)
               LEFT JOIN task_attempts a USING (task_id)
               GROUP BY s.task_id, r.max_attempts"""
        )
        for r in rows:
            assert r["tries"] <= r["max_attempts"], r

    def teardown(self) -> None:
        # Nothing left running: the next run starts with free slots; then the full checker.
        for r in self._q("SELECT task_id FROM task_status WHERE status = 'running'"):
            self.svc.dispatcher.cancel(r["task_id"])
            expire_lease(self.svc, r["task_id"])
        while self.svc.dispatcher.reap():
            pass
        assert_invariants(self.svc)


def test_the_lifecycle_keeps_its_invariants_under_any_interleaving(services: Services) -> None:
    Lifecycle.svc = services
    run_state_machine_as_test(
        Lifecycle,
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
