"""Postgres itself failing under a running stack: restarted mid-run, frozen (SIGSTOP) for
longer than a lease, and an idle-in-transaction session held while the queue runs. Each on a
cluster of its own (the run's shared server is never touched). After each: every task ends as
it should, and the invariants checker passes."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.invariants import assert_invariants
from tests.support.processes import children
from tests.support.sandbox import bind_env
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.contract import TERMINAL, TaskSpec
from trace_platform.db.embedded import EmbeddedPostgres
from trace_platform.db.migrate import migrate
from trace_platform.lite.stack import LiteStack

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster() -> Iterator[EmbeddedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="trace-chaos-pg-", dir="/tmp"))
    root.chmod(0o755)
    pg = EmbeddedPostgres(root / "cluster", durable=False)
    pg.start()
    migrate(pg.dsn())
    yield pg
    if pg.running():  # never leave it frozen, whatever the test did
        signal_all(server_pids(pg), signal.SIGCONT)
    pg.destroy()


def stack_on(pg: EmbeddedPostgres, settings: Settings, tmp_path: Path, workers: int) -> LiteStack:
    dsn = pg.dsn()
    own = settings.model_copy(update={"state_dsn": dsn})
    env = {"TRACE_QUEUE_POLL_SECONDS": "0.2", **bind_env(tmp_path)}
    return LiteStack(own, workers=workers, dsn=dsn, worker_env=env)


def create(stack: LiteStack, n: int, seconds: float) -> list[uuid.UUID]:
    d = stack.services.dispatcher
    return [
        d.create_task(
            TaskSpec(job="chaos", operator="sleep", config={"seconds": seconds}, max_attempts=5)
        ).task_id
        for _ in range(n)
    ]


def statuses(stack: LiteStack, ids: list[uuid.UUID]) -> list[str]:
    with psycopg.connect(stack.services.dsn) as conn:
        rows = conn.execute(
            "SELECT status FROM task_status WHERE task_id = ANY(%s)", [ids]
        ).fetchall()
    return [r[0] for r in rows]


def all_done(stack: LiteStack, ids: list[uuid.UUID]) -> list[str] | None:
    try:
        got = statuses(stack, ids)
    except psycopg.OperationalError:
        return None
    return got if len(got) == len(ids) and all(s in TERMINAL for s in got) else None


def server_pids(pg: EmbeddedPostgres) -> list[int]:
    """The postmaster and every backend and helper it forked."""
    postmaster = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
    return [postmaster, *children(postmaster)]


def signal_all(pids: list[int], sig: int) -> None:
    """A backend may have exited since it was listed: that one needs no signal."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def test_a_postgres_restart_mid_run_loses_nothing(
    cluster: EmbeddedPostgres, settings: Settings, tmp_path: Path
) -> None:
    with stack_on(cluster, settings, tmp_path, workers=2) as stack:
        ids = create(stack, 24, 0.3)
        wait_for(lambda: statuses(stack, ids).count("succeeded") >= 4, 60, "some tasks done")
        cluster.stop("fast")  # every connection of the API, workers and reaper breaks
        time.sleep(2)
        cluster.start()
        done = wait_for(lambda: all_done(stack, ids), 120, "every task to end after restart")
        assert done.count("succeeded") == len(ids), done
        assert_invariants(stack.services)


def test_postgres_frozen_longer_than_a_lease_then_thawed(
    cluster: EmbeddedPostgres, settings: Settings, tmp_path: Path
) -> None:
    """SIGSTOP for 5 s (leases are 2 s): heartbeats fail, operators are stopped once their
    lease cannot be renewed, the reaper retries after the thaw; nothing is lost or doubled."""
    with stack_on(cluster, settings, tmp_path, workers=2) as stack:
        ids = create(stack, 12, 1.0)
        wait_for(lambda: "running" in statuses(stack, ids), 60, "tasks running")
        pids = server_pids(cluster)
        try:
            signal_all(pids, signal.SIGSTOP)
            time.sleep(5)
        finally:
            signal_all(pids, signal.SIGCONT)
        done = wait_for(lambda: all_done(stack, ids), 120, "every task to end after the thaw")
        assert done.count("succeeded") == len(ids), done
        assert_invariants(stack.services)


def test_an_idle_in_transaction_session_does_not_stop_the_queue(
    cluster: EmbeddedPostgres, settings: Settings, tmp_path: Path
) -> None:
    """A session that opened a transaction and went idle (holding back vacuum's horizon) for
    the whole run: the queue still drains every task."""
    with stack_on(cluster, settings, tmp_path, workers=2) as stack:
        idle = psycopg.connect(cluster.dsn())
        try:
            idle.execute("SELECT count(*) FROM task_status")  # a snapshot, then idle in txn
            ids = create(stack, 40, 0.0)
            done = wait_for(lambda: all_done(stack, ids), 120, "every task to end")
            assert done.count("succeeded") == len(ids), done
            row = idle.execute("SELECT 1").fetchone()  # still open, still the same transaction
            assert row == (1,)
        finally:
            idle.rollback()
            idle.close()
        assert_invariants(stack.services)
