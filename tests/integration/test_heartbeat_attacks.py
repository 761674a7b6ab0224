"""Attacks on the heartbeat's group commit (dispatcher/beats.py, `heartbeat_many`), its HOT
single statement and the reaper's outage grace (issue 42), against the harness's Postgres and
the real internal API. A batch is formed for real: the first heartbeat's row is held locked by
another transaction, so the ones arriving meanwhile wait for the next statement together."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from tests.integration.test_generic_plans import _rows_read, _running
from tests.support.tasks import queue_tasks
from tests.support.wait import wait_for
from trace_platform.contract import (
    LEASE_TOKEN_HEADER,
    Claim,
    ClaimRequest,
    HeartbeatRequest,
    TaskSpec,
)
from trace_platform.dispatcher.reaper import run_reaper
from trace_platform.services import Services
from trace_platform.store.tasks.params import HeartbeatParams
from trace_platform.store.tasks.postgres import DISPATCHER_PLANS, PostgresTx


def _claimed(services: Services, n: int) -> list[Claim]:
    d = services.dispatcher
    refs = [d.create_task(TaskSpec(job="beat", operator="noop")) for _ in range(n)]
    return [d.claim(ClaimRequest(task_id=r.task_id, worker_id="w")) for r in refs]


def _beat_http(api: httpx.Client, c: Claim, attempt: int | None = None, body: str = "{}") -> int:
    r = api.post(
        "/internal/heartbeat",
        params={"task_id": str(c.task_id), "attempt": attempt or c.attempt},
        headers={LEASE_TOKEN_HEADER: str(c.lease_token), "Content-Type": "application/json"},
        content=body,
    )
    return r.status_code


@contextmanager
def _row_locked(dsn: str, task_id: uuid.UUID) -> Iterator[None]:
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1 FROM task_status WHERE task_id = %s FOR UPDATE", [task_id])
        yield
        conn.rollback()


def _waiting_on_a_lock(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchone()
    return bool(row and row[0])


def in_one_batch(
    services: Services, dsn: str, leader: Claim, calls: list[Callable[[], Any]]
) -> list[Any]:
    """Each of `calls` (heartbeats) in a thread, all written in one statement: a heartbeat of
    `leader`, whose row another transaction holds, leads first and waits on the lock while the
    others queue behind it; then the lock goes. Each call's answer, or the error it raised."""
    beats = services.dispatcher.beats
    results: list[Any] = [None] * len(calls)
    answered: list[int] = []  # those answered before reaching the batcher (refused)

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            results[i] = call()
        except Exception as e:  # the caller's answer, whatever it is
            results[i] = e
        answered.append(i)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    with _row_locked(dsn, leader.task_id):
        first = threading.Thread(target=_own_beat, args=(services, leader))
        first.start()
        wait_for(lambda: _waiting_on_a_lock(dsn), 10, "the first heartbeat waiting on the lock")
        for t in threads:
            t.start()
        wait_for(
            lambda: len(beats._pending) + len(answered) == len(calls),
            10,
            "the others queued behind it",
        )
    for t in [first, *threads]:
        t.join(timeout=30)
        assert not t.is_alive(), "a heartbeat caller never answered"
    return results


def _own_beat(services: Services, c: Claim) -> None:
    services.dispatcher.heartbeat(HeartbeatRequest(**_lease(c)))


def _lease(c: Claim) -> dict[str, Any]:
    return {"task_id": c.task_id, "attempt": c.attempt, "lease_token": c.lease_token}


def test_one_poisoned_heartbeat_does_not_fail_the_honest_ones_of_its_batch(
    api: httpx.Client, services: Services, dsn: str
) -> None:
    """Heartbeats of different workers' tasks share a statement (one bigint[] of their
    attempts). An attempt past bigint (the API bounded it below only) failed the whole batch
    with a DataError: every honest heartbeat beside it was answered 422, which a worker takes
    as its lease lost (it abandons the attempt). Now refused alone, as no stored attempt (the
    column is INT), and the honest ones of its batch land."""
    lead, *honest = _claimed(services, 4)
    bad = _claimed(services, 2)
    calls: list[Callable[[], Any]] = [lambda c=c: _beat_http(api, c) for c in honest]
    calls += [
        lambda: _beat_http(api, bad[0], attempt=2**63),
        lambda: _beat_http(api, bad[1], attempt=2**31),
    ]
    answers = in_one_batch(services, dsn, lead, calls)
    assert answers[: len(honest)] == [200] * len(honest), answers
    assert answers[len(honest) :] == [422, 422], answers


def test_a_batch_of_heartbeats_reads_its_tasks_by_key(dsn: str) -> None:
    """`heartbeat_many` under the Dispatcher's generic plans, made from statistics in which
    running tasks were a handful (a fleet started since the last ANALYZE): with `status =
    'running'` a condition of the scan, the plan read every running row off the live status
    index and kept the batch's by filter (1,509 rows for a batch of 2 among 2,000 running
    tasks, on every batch). Each batch reads its own rows."""
    with psycopg.connect(dsn, row_factory=dict_row, autocommit=True) as conn:
        queue_tasks(conn, 6)
        _running(conn, 2)
        conn.execute("ANALYZE")
        leases = _running(conn, 2_000)  # a fleet at work, not yet analysed
    read: dict[int, int] = {}
    with psycopg.connect(dsn, row_factory=dict_row, prepare_threshold=0) as conn:
        tx = PostgresTx(conn)
        for k in (2, 50, 400):
            conn.execute(DISPATCHER_PLANS)
            beats = [
                HeartbeatParams(r["task_id"], r["attempt"], r["lease_token"], 60.0, {"k": k})
                for r in leases[:k]
            ]
            before = _rows_read(conn)
            assert set(tx.heartbeat_many(beats)) == {b.task_id for b in beats}
            read[k] = _rows_read(conn) - before
            conn.commit()  # each batch commits, as the Dispatcher's do
    assert all(n <= k for k, n in read.items()), f"task rows read by batch size: {read}"


def _lapse(dsn: str, task_id: uuid.UUID) -> None:
    """The task's lease ran out a minute ago (its worker is dead)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE task_status SET lease_until = now() - interval '1 minute' WHERE task_id = %s",
            [task_id],
        )


def _reaped_as_lost(d: Any, task_id: uuid.UUID) -> None:
    """A reaper loop ticking every 50 ms ends the task's lapsed lease (within 20 s)."""
    stop = threading.Event()
    t = threading.Thread(target=run_reaper, args=(d, stop, 0.05))
    t.start()
    try:
        wait_for(lambda: d.get_task(task_id).status != "running", 20, "the lease ended")
    finally:
        stop.set()
        t.join(timeout=10)
    assert "lost its lease" in (d.get_task(task_id).last_error or "")


def test_a_reaper_whose_database_calls_fail_now_and_then_still_ends_a_dead_lease(
    services: Services, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reaper's outage grace (a lease lapsed while it could not watch is ended only after
    a whole lease watched) restarted its watch on any failed tick. A database that fails one
    call in three (a flaky network, statement timeouts under load) never gave it a lease's
    worth of ticks in a row: a dead worker's lease was never ended. A failure shorter than a
    beat stopped no beat: the watch goes on through it."""
    d = services.dispatcher
    monkeypatch.setattr(d, "settings", d.settings.model_copy(update={"lease_seconds": 1.0}))
    (dead,) = _claimed(services, 1)
    _lapse(dsn, dead.task_id)
    reap, calls = d.reap, [0]

    def flaky(*args: Any, **kwargs: Any) -> int:
        calls[0] += 1
        if calls[0] % 3 == 0:
            raise psycopg.OperationalError("connection lost (injected)")
        return reap(*args, **kwargs)

    monkeypatch.setattr(d, "reap", flaky)
    _reaped_as_lost(d, dead.task_id)


def test_a_reaper_whose_partition_upkeep_fails_still_ends_a_dead_lease(
    services: Services, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition upkeep (first tick, then every six hours) failing on every try (a role
    without CREATE, a full disk) stopped the whole tick before anything was reaped."""
    d = services.dispatcher
    monkeypatch.setattr(d, "settings", d.settings.model_copy(update={"lease_seconds": 0.5}))
    (dead,) = _claimed(services, 1)
    _lapse(dsn, dead.task_id)

    def refused() -> int:
        raise psycopg.errors.InsufficientPrivilege("permission denied (injected)")

    monkeypatch.setattr(d.store, "ensure_partitions", refused)
    _reaped_as_lost(d, dead.task_id)


def test_a_reaper_skips_a_lease_a_heartbeat_is_extending_and_then_sees_it_extended(
    services: Services, dsn: str
) -> None:
    """The heartbeat takes no row lock first: a batch extending a lapsed lease holds the row
    only while it writes. The reaper, reading the lapsed lease meanwhile, skips the locked
    row (never waits, never ends it on the version it read), and once the batch commits the
    lease is no longer lapsed: the attempt is extended, not also failed."""
    d = services.dispatcher
    racing, other = _claimed(services, 2)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE task_status SET lease_until = now() - interval '1 second' "
            "WHERE task_id = ANY(%s)",
            [[racing.task_id, other.task_id]],
        )
    beats = [
        HeartbeatParams(c.task_id, c.attempt, c.lease_token, 60.0, None) for c in (racing, other)
    ]
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        assert set(PostgresTx(conn).heartbeat_many(beats)) == {racing.task_id, other.task_id}
        with ThreadPoolExecutor(1) as pool:  # a reap that waited on the rows fails, not hangs
            reaped = pool.submit(d.reap)
            try:
                assert reaped.result(timeout=10) == 0  # both rows held by the batch: skipped
            finally:
                conn.commit()  # (a waiting reap then ends)
    assert d.reap() == 0
    for c in (racing, other):
        task = d.get_task(c.task_id)
        assert (task.status, task.attempt) == ("running", c.attempt)
    assert d.heartbeat(HeartbeatRequest(**_lease(racing))).status == "running"
