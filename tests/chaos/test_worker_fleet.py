"""The worker registry with real worker processes: a worker registered as another host is
SIGKILLed, and the registry (not its tasks' leases, which outlast the test) sees it dead within
three of its beats and has its task retried."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.invariants import assert_invariants, assert_no_dead_holders
from tests.support.sandbox import bind_env
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.contract import TaskSpec
from trace_platform.contract_fleet import DEAD_AFTER_BEATS
from trace_platform.lite.stack import LiteStack

pytestmark = pytest.mark.slow

BEAT = 0.5
ELSEWHERE = "worker-7.elsewhere.example"


@pytest.fixture
def stack(settings: Settings, dsn: str, tmp_path: Path) -> Iterator[LiteStack]:
    # Leases far longer than the test: only the registry can end the attempt in time.
    long_lease = settings.model_copy(update={"lease_seconds": 120.0, "heartbeat_seconds": 1.0})
    env = {"TRACE_QUEUE_POLL_SECONDS": "0.2", **bind_env(tmp_path)}
    s = LiteStack(long_lease, workers=0, dsn=dsn, worker_env=env, sinks=0, deliverers=0)
    s.start()
    yield s
    s.stop()


def worker_row(dsn: str, worker_id: str) -> dict[str, Any] | None:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(
            "SELECT host, state, slots, beat_seconds, ended_reason, "
            "extract(epoch FROM ended_at - last_beat)::float8 AS silent_for "
            "FROM workers WHERE worker_id = %s",
            (worker_id,),
        )
        row = cur.fetchone()
        return dict(zip([c.name for c in cur.description or []], row, strict=True)) if row else None


def test_a_killed_worker_on_another_host_is_seen_dead_and_its_task_retried(
    stack: LiteStack, settings: Settings
) -> None:
    d, dsn = stack.services.dispatcher, stack.services.dsn
    far = stack.add_worker({"TRACE_WORKER_HOST": ELSEWHERE, "TRACE_WORKER_BEAT_SECONDS": str(BEAT)})
    ref = d.create_task(
        TaskSpec(job="long", operator="sleep", config={"seconds": 3}, max_attempts=3)
    )
    wait_for(lambda: d.get_task(ref.task_id).status == "running", 60, "attempt 1 running")
    holder = d.get_task(ref.task_id).attempts[0].worker_id
    assert holder is not None and holder.startswith(f"{ELSEWHERE}:{far.pid}:")
    row = worker_row(dsn, holder)
    assert row is not None and (row["host"], row["state"], row["slots"]) == (ELSEWHERE, "alive", 1)

    far.send_signal(signal.SIGKILL)
    far.wait()
    killed = time.monotonic()
    # Another host's worker: no local check can tell it is gone (its pid is not looked up).
    assert_no_dead_holders(stack.services)
    dead = wait_for(
        lambda: (r := worker_row(dsn, holder)) is not None and r["state"] == "dead" and r,
        30,
        "the registry to declare the worker dead",
    )
    seen_after = time.monotonic() - killed
    # Declared after three beats of silence, not before, and at the reaper's next tick after.
    beats = DEAD_AFTER_BEATS * BEAT
    assert beats <= dead["silent_for"] <= beats + settings.reaper_interval_seconds + 1.0, dead
    assert seen_after < beats + settings.reaper_interval_seconds + 2.0, seen_after
    assert "declared dead" in dead["ended_reason"]

    # Its attempt was ended with it (its lease still had about two minutes to run)...
    view = d.get_task(ref.task_id)
    assert view.status in ("queued", "running") and view.attempts[0].outcome == "lease_expired"
    assert holder in (view.attempts[0].error or "") and "declared dead" in (
        view.attempts[0].error or ""
    )
    # ...and is retried by its own policy on a live worker.
    stack.add_worker()
    wait_for(lambda: d.get_task(ref.task_id).status == "succeeded", 60, "the retry to succeed")
    view = d.get_task(ref.task_id)
    assert [a.outcome for a in view.attempts] == ["lease_expired", "succeeded"]
    assert view.attempts[1].worker_id != holder
    assert_invariants(stack.services)


def test_a_worker_stops_cleanly_as_stopped(stack: LiteStack) -> None:
    w = stack.add_worker({"TRACE_WORKER_BEAT_SECONDS": str(BEAT)})
    dsn = stack.services.dsn

    def registered() -> str | None:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT worker_id FROM workers WHERE pid = %s AND state = 'alive'", (w.pid,)
            ).fetchone()
        return row[0] if row else None

    wid = wait_for(registered, 60, "the worker to register")
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 0
    row = worker_row(dsn, wid)
    assert row is not None and row["state"] == "stopped"
