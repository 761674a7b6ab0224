"""What the Dispatcher's batch statements lock: claim_many only the rows it claims,
complete_fast_many in task_id order whatever order its input came in, and each re-checks a
row a concurrent transaction changed (its newest version decides)."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tests.support.tasks import queue_tasks
from trace_platform.store.tasks.params import ClaimManyParams, LeaseCheck
from trace_platform.store.tasks.postgres import PostgresTx


def _connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, row_factory=dict_row)


def _locked(dsn: str, ids: list[Any]) -> set[Any]:
    """Which of `ids` another transaction holds locked."""
    with _connect(dsn) as other:
        free = other.execute(
            "SELECT task_id FROM task_status WHERE task_id = ANY(%s) FOR UPDATE SKIP LOCKED",
            [ids],
        ).fetchall()
    return set(ids) - {r["task_id"] for r in free}


def _claimed(dsn: str, ids: list[Any]) -> dict[Any, LeaseCheck]:
    with _connect(dsn) as conn:
        rows = PostgresTx(conn).claim_many(
            ClaimManyParams(ids, ["w"] * len(ids), 600.0, [None] * len(ids))
        )
    return {r["task_id"]: LeaseCheck(r["task_id"], r["attempt"], r["lease_token"]) for r in rows}


def test_a_batch_claim_locks_only_what_it_claims(dsn: str) -> None:
    """A task with a worker pool is claimed one by one (its slot): the batch leaves it, and
    must leave it unlocked, or that one-task claim (or a cancel) waits for the batch."""
    with _connect(dsn) as conn:
        plain, pooled = queue_tasks(conn, 2), queue_tasks(conn, 2, worker_pool="gpu")
        conn.commit()
        got = PostgresTx(conn).claim_many(
            ClaimManyParams(plain + pooled, ["w"] * 4, 60.0, [None] * 4)
        )
        assert {r["task_id"] for r in got} == set(plain)
        assert _locked(dsn, plain + pooled) == set(plain)  # the batch is still open


def test_batch_completions_lock_in_task_id_order(dsn: str) -> None:
    """Two batches completing overlapping leases, handed them in different orders, must not
    deadlock: each locks its rows in task_id order. Two other transactions hold c and d while
    both batches start, so each has locked what it reached first when they let go."""
    with _connect(dsn) as conn:
        a, b, c, d = sorted(queue_tasks(conn, 4))
    checks = _claimed(dsn, [a, b, c, d])
    holders = [_connect(dsn), _connect(dsn)]
    for holder, task in zip(holders, (c, d), strict=True):
        holder.execute("SELECT 1 FROM task_status WHERE task_id = %s FOR UPDATE", [task])
    errors: list[str] = []

    def batch(order: list[Any]) -> None:
        with _connect(dsn) as conn:
            try:
                PostgresTx(conn).complete_fast_many([checks[t] for t in order])
            except psycopg.Error as e:
                errors.append(type(e).__name__)

    runs = [
        threading.Thread(target=batch, args=([c, b, a],)),
        threading.Thread(target=batch, args=([a, d, b],)),
    ]
    for run in runs:
        run.start()
        time.sleep(0.5)
    for holder in holders:
        holder.rollback()
        time.sleep(0.5)
        holder.close()
    for run in runs:
        run.join(10)
    assert errors == [], f"two batches of the same leases deadlocked: {errors}"


def test_batch_completions_check_the_newest_row(dsn: str) -> None:
    """A lease changed by a transaction that commits while the batch waits for its row: the
    newest version decides (a new lease token: not this attempt's to complete; a renewed
    lease, as a heartbeat leaves it: still its own)."""
    with _connect(dsn) as conn:
        superseded, renewed, untouched = queue_tasks(conn, 3)
    checks = _claimed(dsn, [superseded, renewed, untouched])
    other = _connect(dsn)
    other.execute(
        "UPDATE task_status SET lease_token = gen_random_uuid() WHERE task_id = %s", [superseded]
    )
    other.execute(
        "UPDATE task_status SET lease_until = now() + interval '1 hour' WHERE task_id = %s",
        [renewed],
    )
    done: list[set[Any]] = []

    def batch() -> None:
        with _connect(dsn) as conn:
            done.append(PostgresTx(conn).complete_fast_many(list(checks.values())))

    run = threading.Thread(target=batch)
    run.start()
    time.sleep(0.5)  # the batch waits on both rows
    other.commit()
    other.close()
    run.join(10)
    assert done == [{renewed, untouched}]
