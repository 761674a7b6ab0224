"""Whole Lite stack with real worker processes: duplicates, killed workers, poison messages."""

from __future__ import annotations

import ctypes
import json
import platform
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.invariants import assert_invariants, assert_no_dead_holders
from tests.support.processes import alive, children
from tests.support.sandbox import bind_env, record_dir
from tests.support.wait import exit_code, wait_for
from trace_platform.config import Settings
from trace_platform.contract import TERMINAL, DatasetRef, TaskSpec
from trace_platform.lite.stack import ApiServer, LiteStack

pytestmark = pytest.mark.slow

WORKER_ENV = {"TRACE_QUEUE_POLL_SECONDS": "0.2", "TRACE_LEASE_SECONDS": "2"}


@pytest.fixture
def stack(
    settings: Settings, dsn: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[LiteStack]:
    workers = getattr(request, "param", 2)
    s = LiteStack(
        settings, workers=workers, dsn=dsn, worker_env={**WORKER_ENV, **bind_env(tmp_path)}
    )
    s.start()
    yield s
    s.stop()


SYS_TGKILL = 234  # x86_64: a signal to one thread of a process


def status(stack: LiteStack, task_id: uuid.UUID) -> tuple[str, int]:
    v = stack.services.dispatcher.get_task(task_id)
    return v.status, v.attempt


def test_mixed_tasks_run_to_their_outcomes(stack: LiteStack) -> None:
    d = stack.services.dispatcher
    specs = {
        "ok": TaskSpec(job="ok", operator="noop"),
        "flaky": TaskSpec(
            job="flaky",
            operator="fail",
            config={"succeed_on_attempt": 2},
            retry_backoff_seconds=0.1,
        ),
        "broken": TaskSpec(job="broken", operator="fail", config={"permanent": True}),
        "unknown": TaskSpec(job="unknown", operator="no_such_operator", max_attempts=1),
        # An ad-hoc task speaks only for the outputs it was created with.
        "events": TaskSpec(
            job="events",
            operator="emit_events",
            config={"count": 4, "final": 2},
            outputs=[DatasetRef(dataset_uuid=uuid.uuid4())],
        ),
    }
    ids = {k: d.create_task(s).task_id for k, s in specs.items()}
    wait_for(lambda: all(status(stack, i)[0] in TERMINAL for i in ids.values()), 60, "all terminal")
    got = {k: status(stack, i) for k, i in ids.items()}
    assert got == {
        "ok": ("succeeded", 1),
        "flaky": ("succeeded", 2),
        "broken": ("failed", 1),
        "unknown": ("failed", 1),
        "events": ("succeeded", 1),
    }
    assert "unknown operator 'no_such_operator'" in (d.get_task(ids["unknown"]).last_error or "")
    assert "PermanentError" in (d.get_task(ids["broken"]).last_error or "")
    assert d.get_task(ids["events"]).events == 4
    wait_for(lambda: not stack.services.driver.receive("tasks", 1, 0.01), 20, "queue empty")
    assert_invariants(stack.services)
    # The workers claimed and completed through the API's exchange listener.
    assert stack.api.app.state.exchange_listener.server.answered >= len(ids)


def test_duplicate_wakeups_run_operator_once(stack: LiteStack, tmp_path: Path) -> None:
    record = record_dir(tmp_path) / "runs.txt"
    d = stack.services.dispatcher
    refs = [
        d.create_task(TaskSpec(job="dup", operator="noop", config={"record_to": str(record)}))
        for _ in range(6)
    ]
    for r in refs:  # a redelivering queue: three extra wake-ups for every task
        for _ in range(3):
            stack.services.driver.publish(
                "tasks", {"kind": "task_wakeup", "task_id": str(r.task_id)}
            )
    wait_for(
        lambda: all(status(stack, r.task_id) == ("succeeded", 1) for r in refs), 60, "succeeded"
    )
    wait_for(
        lambda: stack.services.driver.receive("tasks", 1, 0.01) == [],
        30,
        "duplicates acked and dropped",
    )
    runs = Counter(record.read_text().split("\n")[:-1])
    assert runs == Counter({f"{r.task_id} 1": 1 for r in refs})
    assert_invariants(stack.services)


def test_reordered_early_and_late_wakeups_change_nothing(stack: LiteStack, tmp_path: Path) -> None:
    """Wake-ups out of order: in reverse, for a retry still backing off (early), and for tasks
    already finished (late, delayed past their end). Each attempt runs once, a retry never
    starts before its backoff, and every stray wake-up is acked and dropped."""
    record = record_dir(tmp_path) / "runs.txt"
    d, driver = stack.services.dispatcher, stack.services.driver
    plain = [
        d.create_task(TaskSpec(job="order", operator="noop", config={"record_to": str(record)}))
        for _ in range(6)
    ]
    flaky = d.create_task(
        TaskSpec(
            job="order_flaky",
            operator="fail",
            config={"succeed_on_attempt": 2},
            retry_backoff_seconds=3.0,
            retry_backoff_max_seconds=3.0,
        )
    )

    def wake(task_id: uuid.UUID, delay: int = 0) -> None:
        driver.publish("tasks", {"kind": "task_wakeup", "task_id": str(task_id)}, delay)

    for r in reversed(plain):
        wake(r.task_id)
        wake(r.task_id, 2)  # late: arrives after the task ended
    wait_for(lambda: status(stack, flaky.task_id) == ("queued", 1), 30, "the flaky task's retry")
    for _ in range(5):  # early: the retry is still backing off
        wake(flaky.task_id)
    finished = [*plain, flaky]
    wait_for(lambda: all(status(stack, r.task_id)[0] == "succeeded" for r in finished), 60, "done")
    view = d.get_task(flaky.task_id)
    first, second = view.attempts
    assert first.finished_at is not None
    assert (second.started_at - first.finished_at).total_seconds() >= 1.5  # backoff/2 at least
    assert view.attempt == 2
    time.sleep(2.5)  # the late wake-ups come due
    wait_for(lambda: driver.receive("tasks", 1, 0.01) == [], 30, "stray wake-ups acked")
    runs = Counter(record.read_text().split("\n")[:-1])
    assert runs == Counter({f"{r.task_id} 1": 1 for r in plain})
    assert all(status(stack, r.task_id) == ("succeeded", 1) for r in plain)
    assert_invariants(stack.services)


@pytest.mark.parametrize("stack", [1], indirect=True)
def test_killed_worker_is_reaped_retried_and_fenced(
    stack: LiteStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = stack.services.dispatcher
    # The reaper (a thread of this process's API) can be held, so the dead holder is seen for
    # sure before the lease runs out and the attempt is reaped.
    reaping = threading.Event()
    reaping.set()
    real_reap = d.reap
    monkeypatch.setattr(
        d,
        "reap",
        lambda limit=100, leases=True: real_reap(limit, leases) if reaping.is_set() else 0,
    )
    ref = d.create_task(
        TaskSpec(job="long", operator="sleep", config={"seconds": 60}, max_attempts=3)
    )
    wait_for(lambda: status(stack, ref.task_id) == ("running", 1), 30, "attempt 1 running")

    def progress() -> Any:
        with psycopg.connect(stack.services.dsn) as conn:
            row = conn.execute(
                "SELECT progress FROM task_status WHERE task_id = %s", (ref.task_id,)
            ).fetchone()
        return row[0] if row else None

    # The operator's ctx.progress reaches the task's row through the wrapper's heartbeats.
    reported = wait_for(progress, 30, "a progress report")
    assert 0 < reported["done"] < 1
    with psycopg.connect(stack.services.dsn) as conn:
        token = conn.execute(
            "SELECT lease_token FROM task_status WHERE task_id = %s", (ref.task_id,)
        ).fetchone()
    assert token is not None
    worker = stack.workers[0]
    hosts = children(worker.pid)
    assert hosts, "the operator runs in a child process of the worker"
    reaping.clear()
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    # Still 'running' (the reaper held: whether or not its lease ran out yet, a lease-only check
    # cannot tell its holder is gone): the checker sees the dead holder. (This was asserted only
    # if the reaper had not reaped the attempt first, issue 39.)
    assert status(stack, ref.task_id) == ("running", 1)
    with pytest.raises(AssertionError, match="running under a dead worker"):
        assert_no_dead_holders(stack.services)
    reaping.set()
    # The operator host dies with its wrapper: nothing runs on unsupervised.
    wait_for(lambda: not any(alive(p) for p in hosts), 10, "operator host to die")

    wait_for(lambda: status(stack, ref.task_id)[0] == "queued", 30, "reaper to expire the lease")
    view = d.get_task(ref.task_id)
    assert view.attempts[0].outcome == "lease_expired"
    stack.add_worker()
    wait_for(lambda: status(stack, ref.task_id) == ("running", 2), 30, "attempt 2 running")

    late = httpx.post(
        f"{stack.url}/internal/task-complete",
        json={"outcome": "succeeded"},
        params={"task_id": str(ref.task_id), "attempt": 1},
        headers={
            "X-Internal-Token": stack.services.internal_token or "",
            "X-Lease-Token": str(token[0]),
        },
    )
    assert late.status_code == 409 and late.json()["error"] == "stale_attempt"
    assert status(stack, ref.task_id) == ("running", 2)

    # Cooperative cancel ends attempt 2.
    d.cancel(ref.task_id)
    wait_for(lambda: status(stack, ref.task_id)[0] == "canceled", 30, "cancel to land")
    assert [a.outcome for a in d.get_task(ref.task_id).attempts] == ["lease_expired", "canceled"]
    assert_invariants(stack.services)


@pytest.mark.parametrize("stack", [1], indirect=True)
def test_poison_message_dead_letters_and_nothing_else(stack: LiteStack) -> None:
    with psycopg.connect(stack.services.dsn) as conn:
        conn.execute(
            "INSERT INTO queue_messages (queue_name, payload, max_attempts) VALUES ('tasks', %s, 3)",
            (json.dumps({"kind": "task_wakeup", "task_id": "not-a-uuid"}),),
        )
    d = stack.services.dispatcher
    ok = [d.create_task(TaskSpec(job="ok", operator="noop")).task_id for _ in range(3)]
    wait_for(lambda: len(stack.services.driver.dead_letters("tasks")) == 1, 30, "dead letter")
    wait_for(lambda: all(status(stack, t)[0] == "succeeded" for t in ok), 30, "good tasks")
    dead = stack.services.driver.dead_letters("tasks")
    assert dead[0]["payload"] == {"kind": "task_wakeup", "task_id": "not-a-uuid"}
    assert dead[0]["attempts"] == 3 and "poison message" in dead[0]["last_error"]
    assert_invariants(stack.services, allow_dead=1)


def test_worker_survives_operator_process_crash(stack: LiteStack) -> None:
    """An operator that kills its own process fails the attempt; the next one runs normally."""
    d = stack.services.dispatcher
    crash = d.create_task(TaskSpec(job="crash", operator="crash", max_attempts=1))
    wait_for(lambda: status(stack, crash.task_id)[0] == "failed", 30, "crash recorded")
    assert "operator process died" in (d.get_task(crash.task_id).last_error or "")
    ok = d.create_task(TaskSpec(job="ok", operator="noop"))
    wait_for(lambda: status(stack, ok.task_id)[0] == "succeeded", 30, "next task")
    assert_invariants(stack.services)


def test_long_task_keeps_its_wakeup_invisible(settings: Settings, dsn: str) -> None:
    """Visibility (1 s) shorter than the task (3 s): the wrapper extends it, so the wake-up is
    never redelivered while the task runs. A second, idle worker is there to take a
    redelivery (it would find the task running and drop the wake-up): the message must stay,
    delivered once, for the whole run."""
    env = {**WORKER_ENV, "TRACE_WORKER_VISIBILITY_SECONDS": "1"}
    with LiteStack(settings, workers=2, dsn=dsn, worker_env=env) as stack:
        d = stack.services.dispatcher
        ref = d.create_task(TaskSpec(job="long", operator="sleep", config={"seconds": 3}))
        wait_for(lambda: status(stack, ref.task_id)[0] == "running", 30, "running")
        deliveries = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            while status(stack, ref.task_id)[0] == "running":
                row = conn.execute(
                    "SELECT attempts FROM queue_messages WHERE payload->>'task_id' = %s",
                    (str(ref.task_id),),
                ).fetchone()
                deliveries.append(row[0] if row else None)
                time.sleep(0.1)
        assert len(deliveries) > 10 and set(deliveries[:-1]) == {1}, deliveries
        assert status(stack, ref.task_id) == ("succeeded", 1)
        assert_invariants(stack.services)


@pytest.mark.parametrize("stack", [1], indirect=True)
def test_a_refused_completion_fails_the_attempt_at_once(stack: LiteStack) -> None:
    """Final events for a dataset the task does not produce: 403, and the attempt fails now,
    naming the refusal (not after its lease runs out), with nothing stored."""
    d = stack.services.dispatcher
    ref = d.create_task(
        TaskSpec(
            job="foreign",
            operator="emit_events",
            config={"count": 1, "final": 1, "dataset_uuid": str(uuid.uuid4())},
            outputs=[DatasetRef(dataset_uuid=uuid.uuid4())],
            max_attempts=3,
        )
    )
    wait_for(lambda: status(stack, ref.task_id)[0] == "failed", 20, "the refusal")
    view = d.get_task(ref.task_id)
    assert view.attempt == 1 and "completion refused" in (view.last_error or "")
    assert "does not produce" in (view.last_error or "") and view.events == 0


def test_an_api_outage_shorter_than_the_lease_costs_the_attempt_nothing(
    settings: Settings, dsn: str, tmp_path: Path
) -> None:
    """The API goes away for 9 s (longer than the client's own retries, shorter than the 30 s
    lease) while the operator runs: the worker keeps it running, heartbeats again when the API
    is back, and the first attempt succeeds."""
    long_lease = settings.model_copy(update={"lease_seconds": 30.0, "heartbeat_seconds": 1.0})
    env = {"TRACE_QUEUE_POLL_SECONDS": "0.2", **bind_env(tmp_path)}
    with LiteStack(long_lease, workers=1, dsn=dsn, worker_env=env) as stack:
        d = stack.services.dispatcher
        ref = d.create_task(TaskSpec(job="outage", operator="sleep", config={"seconds": 16}))
        wait_for(lambda: status(stack, ref.task_id) == ("running", 1), 30, "attempt 1 running")
        time.sleep(1)
        stack.api.stop()
        time.sleep(9)
        stack.api = ApiServer(stack.services, settings.api_host, stack.port)
        stack.api.start()
        wait_for(lambda: status(stack, ref.task_id)[0] in TERMINAL, 60, "the task to end")
        view = d.get_task(ref.task_id)
        assert view.status == "succeeded"
        assert [a.outcome for a in view.attempts] == ["succeeded"]
        assert_invariants(stack.services)


def _threads_taking(pid: int, sig: int, but: int) -> Iterator[int]:
    """The process's threads (but one) that do not block `sig`: one of them may be handed it."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        blocked = int(
            next(ln for ln in status.splitlines() if ln.startswith("SigBlk:")).split()[1], 16
        )
        if int(task.name) != but and not blocked & (1 << (sig - 1)):
            yield int(task.name)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="tgkill is syscall 234 on x86_64")
def test_a_sigterm_another_thread_takes_still_drains_the_worker(
    settings: Settings, dsn: str, tmp_path: Path
) -> None:
    """A signal sent to a process is delivered to any one of its threads that does not block
    it, and Python runs its handler only in the main thread. Blocked in a plain `join()`, the
    main thread never ran it when another thread took the signal: the worker went on taking
    work until some later signal woke it (a 30 s flake of the drain test below). Here the
    SIGTERM is sent to one of the worker's other threads (tgkill)."""
    with LiteStack(settings, workers=1, dsn=dsn, worker_env=bind_env(tmp_path)) as stack:
        worker = stack.workers[0]
        ref = stack.services.dispatcher.create_task(TaskSpec(job="up", operator="noop"))
        wait_for(lambda: status(stack, ref.task_id)[0] == "succeeded", 60, "the worker up")
        other = next(_threads_taking(worker.pid, signal.SIGTERM, but=worker.pid))
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(SYS_TGKILL, worker.pid, other, signal.SIGTERM) == 0
        assert exit_code(worker, 15) == 0


def test_sigterm_drains_the_running_task_then_hands_back_what_outlives_the_grace(
    settings: Settings, dsn: str, tmp_path: Path
) -> None:
    """SIGTERM: a task that finishes within the drain grace succeeds on its first attempt; one
    that outlives it is handed back (attempt `released`) and runs again elsewhere although its
    only try was that attempt (max_attempts 1)."""
    env = {"TRACE_QUEUE_POLL_SECONDS": "0.2", "TRACE_WORKER_DRAIN_SECONDS": "6"}
    slow = settings.model_copy(update={"lease_seconds": 10.0, "heartbeat_seconds": 0.5})
    with LiteStack(slow, workers=1, dsn=dsn, worker_env={**env, **bind_env(tmp_path)}) as stack:
        d = stack.services.dispatcher
        short = d.create_task(TaskSpec(job="short", operator="sleep", config={"seconds": 3}))
        wait_for(lambda: status(stack, short.task_id) == ("running", 1), 30, "short running")
        stack.workers[0].send_signal(signal.SIGTERM)
        wait_for(lambda: status(stack, short.task_id)[0] in TERMINAL, 30, "short to end")
        assert [a.outcome for a in d.get_task(short.task_id).attempts] == ["succeeded"]
        assert exit_code(stack.workers[0], 30) == 0  # drained, then exited by itself

        stack.add_worker()
        long = d.create_task(
            TaskSpec(job="long", operator="sleep", config={"seconds": 120}, max_attempts=1)
        )
        wait_for(lambda: status(stack, long.task_id) == ("running", 1), 30, "long running")
        started = time.monotonic()
        stack.workers[1].send_signal(signal.SIGTERM)
        wait_for(lambda: status(stack, long.task_id)[0] != "running", 30, "long handed back")
        assert 5 <= time.monotonic() - started < 20  # after the 6 s grace, not at once
        view = d.get_task(long.task_id)
        assert view.status == "queued" and [a.outcome for a in view.attempts] == ["released"]
        assert exit_code(stack.workers[1], 30) == 0
        stack.add_worker()  # its one try was not spent: it runs again
        wait_for(lambda: status(stack, long.task_id) == ("running", 2), 30, "attempt 2")
        d.cancel(long.task_id)
        wait_for(lambda: status(stack, long.task_id)[0] == "canceled", 30, "cancel to land")
        assert_invariants(stack.services)
