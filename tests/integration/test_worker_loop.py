"""The worker's loop (worker/reactor.py) against a real API, Postgres queue and operator hosts:
short attempts live their whole life in the loop, on hosts that live on; whatever can wait (a
host's start, a message other than the end, a heartbeat due) goes to the wrapper's own thread;
a claim or a report that fails on the way is tried again, and a wake-up is acked only after its
attempt's report was answered."""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.test_claim_retry import _spoil_first_answer
from tests.support.queue_conformance import wake
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.contract import DatasetRef, TaskSpec
from trace_platform.objectstore import make_store
from trace_platform.queue.pgqueue import PgQueue
from trace_platform.services import Services
from trace_platform.worker import reactor
from trace_platform.worker.client import DispatcherClient
from trace_platform.worker.held_acks import HeldAcks
from trace_platform.worker.http import Response
from trace_platform.worker.reactor import Reactor
from trace_platform.worker.wrapper import Wrapper

Q = "tasks"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """A heartbeat every second (a 3 s lease): an attempt stays in the loop that long."""
    return settings.model_copy(update={"heartbeat_seconds": 1.0, "lease_seconds": 3.0})


BAD_GATEWAY = Response(502, b'{"error": "bad_gateway", "message": "upstream reset"}')


class Loop:
    """A worker's loop over `n` wrappers, run in a thread; `submit` queues tasks for it."""

    def __init__(
        self, settings: Settings, services: Services, client: DispatcherClient, dsn: str, n: int
    ) -> None:
        self.services = services
        self.driver = PgQueue.from_dsn(dsn, poll_seconds=0.2)
        store = make_store(settings)
        store.ensure_bucket()
        acks = HeldAcks(self.driver, Q)
        self.wrappers = [
            Wrapper(
                self.driver,
                client,
                store,
                home=settings.home,
                visibility_seconds=30,
                wait_seconds=0.2,
                host_env={"TRACE_OPERATOR_REGISTRY": "testing"},
                acks=acks,
            )
            for _ in range(n)
        ]
        self.reactor = Reactor(self.wrappers)
        self.stop, self.abort = threading.Event(), threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, max_tasks: int | None = None) -> None:
        self.thread = threading.Thread(
            target=self.reactor.run, args=(self.stop, max_tasks, self.abort), daemon=True
        )
        self.thread.start()

    def submit(
        self,
        operator: str = "noop",
        n: int = 1,
        outputs: int = 0,
        max_attempts: int | None = None,
        **config: Any,
    ) -> list[uuid.UUID]:
        made = [DatasetRef(dataset_uuid=uuid.uuid4()) for _ in range(outputs)]
        spec = TaskSpec(
            job="loop", operator=operator, config=config, outputs=made, max_attempts=max_attempts
        )
        ids = [self.services.dispatcher.create_task(spec).task_id for _ in range(n)]
        for task_id in ids:  # no outbox publisher runs here: the wake-ups, as it sends them
            self.driver.publish(Q, wake(task_id))
        return ids

    def status(self, task_id: uuid.UUID) -> tuple[str, int]:
        view = self.services.dispatcher.get_task(task_id)
        return view.status, view.attempt

    def wait_done(self, ids: list[uuid.UUID], timeout: float = 60) -> None:
        wait_for(
            lambda: all(self.status(t)[0] == "succeeded" for t in ids),
            timeout,
            "every task succeeded",
        )

    def queued(self) -> int:
        with self.driver.pool.connection() as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM queue_messages)"
                " + (SELECT coalesce(sum(cardinality(held)), 0) FROM queue_leases) AS n"
            ).fetchone()
        assert row is not None
        return int(row["n"])

    def close(self, timeout: float = 30) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout)
            assert not self.thread.is_alive(), "the loop did not end"


@pytest.fixture
def loop_of(
    settings: Settings, services: Services, client: DispatcherClient, dsn: str
) -> Iterator[Callable[[int], Loop]]:
    made: list[Loop] = []

    def make(n: int) -> Loop:
        made.append(Loop(settings, services, client, dsn, n))
        return made[-1]

    yield make
    for loop in made:
        loop.abort.set()
        loop.close()
        loop.driver.close()


def test_short_attempts_run_in_the_loop_on_hosts_that_live_on(
    loop_of: Callable[[int], Loop],
) -> None:
    loop = loop_of(2)
    loop.start()
    first = loop.submit(n=4)
    loop.wait_done(first)
    hosts = {w.host.proc.pid for w in loop.wrappers if w.host.proc is not None}
    started = loop.reactor.handoffs  # each host's start went to its wrapper's thread
    assert len(hosts) <= 2 and 1 <= started <= 2, (hosts, started)
    second = loop.submit(n=20)
    loop.wait_done(second)
    # The same hosts ran them all (one started by a thread that ended would have died with
    # it), and none left the loop.
    assert {w.host.proc.pid for w in loop.wrappers if w.host.proc is not None} == hosts
    assert loop.reactor.handoffs == started
    loop.close()
    assert loop.queued() == 0  # every wake-up acked, the last ones on the way out
    assert all(loop.status(t) == ("succeeded", 1) for t in first + second)


def test_an_attempt_that_says_more_than_its_end_goes_to_its_thread(
    loop_of: Callable[[int], Loop],
) -> None:
    """An event mid-run takes a call to the API: its wrapper's thread sends it, and supervises
    the attempt to its end; the loop goes on with the others meanwhile."""
    loop = loop_of(2)
    loop.start()
    loop.wait_done(loop.submit(n=2))  # hosts up: later attempts start in the loop
    before = loop.reactor.handoffs
    (talker,) = loop.submit("emit_events", outputs=1, count=3, final=1)
    quiet = loop.submit(n=6)
    loop.wait_done([talker, *quiet])
    assert loop.reactor.handoffs == before + 1
    assert loop.services.dispatcher.get_task(talker).events == 3


def test_a_long_attempt_heartbeats_from_its_thread(loop_of: Callable[[int], Loop]) -> None:
    """Longer than its lease (3 s): kept only by heartbeats, which its thread sends once the
    first comes due (every second here)."""
    loop = loop_of(1)
    loop.start()
    loop.wait_done(loop.submit(n=1))
    before = loop.reactor.handoffs
    (long,) = loop.submit("sleep", seconds=4)
    loop.wait_done([long], 30)
    assert loop.status(long) == ("succeeded", 1) and loop.reactor.handoffs == before + 1


def test_a_flood_of_progress_reports_does_not_hold_up_the_end(
    loop_of: Callable[[int], Loop],
) -> None:
    """Hundreds of lines read off the pipe at once, more than a turn takes: the rest, the end
    among them, are taken at the next turns, not when the first heartbeat comes due (then by
    the attempt's thread)."""
    loop = loop_of(1)
    loop.start()
    loop.wait_done(loop.submit(n=1))
    before = loop.reactor.handoffs
    (wrapper,) = loop.wrappers
    start = wrapper.start_ready

    def start_then_look_away(claim: Any, msg: Any) -> Any:
        run = start(claim, msg)
        time.sleep(0.5)  # the loop busy: the host writes its every line meanwhile
        return run

    wrapper.start_ready = start_then_look_away  # type: ignore[method-assign]
    chatty = loop.submit(progress=500)
    loop.wait_done(chatty, 30)
    assert loop.reactor.handoffs == before  # it ended in the loop, within its first second


def test_a_nack_that_fails_loses_no_wrapper(loop_of: Callable[[int], Loop]) -> None:
    """The database away while the loop nacks a poison message: logged, and the wrapper
    reserved for it serves the next wake-up (with one wrapper, nothing else would run)."""
    loop = loop_of(1)

    def away(*a: Any, **kw: Any) -> Any:
        raise ConnectionError("the database went away")

    loop.driver.nack = away  # type: ignore[method-assign]
    with psycopg.connect(loop.driver.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO queue_messages (queue_name, payload) VALUES (%s, %s)",
            (Q, json.dumps({"kind": "no such kind"})),
        )
    loop.start()  # one wrapper: the poison, the oldest, comes first
    (task,) = loop.submit()
    loop.wait_done([task], 20)


def test_a_wrappers_thread_outlives_a_job_that_fails() -> None:
    """A job's error ends the job, not the thread (a host it started would die with it)."""
    jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
    ran: list[str] = []

    def fails() -> None:
        raise RuntimeError("the database went away")

    thread = threading.Thread(target=reactor._serve, args=(jobs,), daemon=True)
    thread.start()
    for job in (fails, lambda: ran.append("next"), None):
        jobs.put(job)
    thread.join(5)
    assert ran == ["next"] and not thread.is_alive()


def test_a_claim_whose_answer_was_lost_is_tried_again_with_its_key(
    loop_of: Callable[[int], Loop], client: DispatcherClient
) -> None:
    """The claim commits, then a proxy answers 502: the loop asks again with the same request,
    gets the lease it took, and runs the task now (a new key would get a 409, and the task
    would wait out its lease)."""
    loop = loop_of(1)
    spoiled = _spoil_first_answer(client, "/internal/claim", lambda _: BAD_GATEWAY)
    loop.start()
    (task,) = loop.submit()
    loop.wait_done([task], 20)
    assert spoiled and loop.status(task) == ("succeeded", 1)


def test_a_report_that_fails_is_tried_again_and_its_wakeup_acked_after(
    loop_of: Callable[[int], Loop], client: DispatcherClient
) -> None:
    loop = loop_of(1)
    loop.start()
    loop.wait_done(loop.submit(n=1))  # its host up: the next one is reported by the loop
    seen: list[int] = []

    def spoil(_: Response) -> Response:
        seen.append(loop.queued())  # the answer is lost after the report committed
        return BAD_GATEWAY

    spoiled = _spoil_first_answer(client, "/internal/task-complete", spoil)
    (task,) = loop.submit()
    loop.wait_done([task], 20)
    wait_for(lambda: seen, 10, "the report's answer")
    assert spoiled and seen == [1]  # its wake-up still held when the report was answered
    wait_for(lambda: loop.queued() == 0, 10, "its wake-up acked")
    assert loop.status(task) == ("succeeded", 1)


def test_abort_hands_back_what_runs(loop_of: Callable[[int], Loop]) -> None:
    loop = loop_of(2)
    loop.start()
    loop.wait_done(loop.submit(n=2))
    (long,) = loop.submit("sleep", seconds=60)
    wait_for(lambda: loop.status(long)[0] == "running", 20, "running")
    loop.abort.set()
    loop.close(20)
    status, attempt = loop.status(long)
    assert status == "queued" and attempt == 1, (status, attempt)
    view = loop.services.dispatcher.get_task(long)
    assert "worker shut down" in (view.last_error or "")


def test_max_tasks_ends_the_loop_once_that_many_ran(loop_of: Callable[[int], Loop]) -> None:
    loop = loop_of(2)
    ids = loop.submit(n=5)
    loop.start(max_tasks=3)
    assert loop.thread is not None
    loop.thread.join(60)
    assert not loop.thread.is_alive() and loop.reactor.tasks_run == 3
    done = [t for t in ids if loop.status(t)[0] == "succeeded"]
    assert len(done) == 3 and loop.queued() == 2


@pytest.mark.parametrize(
    ("stray", "said"),
    [
        ({"type": "done", "final_events": []}, "a 'done' message for run '{leaver}/1'"),
        ({"type": "ready"}, "a message of unknown type 'ready'"),
    ],
)
def test_what_an_earlier_task_left_running_cannot_end_the_next(
    loop_of: Callable[[int], Loop], stray: dict[str, Any], said: str
) -> None:
    """A thread a task left running in its host says "done" (or what no running task says)
    while the host runs the tenant's next task: the message names its own run, so it fails
    the attempt that runs now retryably (the fault was an earlier task's), its host killed,
    instead of being taken for that attempt's end; the next task runs on a fresh host."""
    loop = loop_of(1)
    loop.start()
    loop.wait_done(loop.submit(n=1))  # the host runs: the next attempts start in the loop
    (wrapper,) = loop.wrappers
    assert wrapper.host.proc is not None
    first_host = wrapper.host.proc.pid
    (leaver,) = loop.submit("probe", max_attempts=1, linger=[stray], linger_after=1.0)
    wait_for(lambda: loop.status(leaver)[0] == "failed", 20, "the probe's own end")
    (sleeper,) = loop.submit("sleep", seconds=3)
    # Back in the queue for its retry (this loop has no outbox relay to wake it), not ended
    # by the stray "done" a second in.
    wait_for(lambda: loop.status(sleeper) == ("queued", 1), 20, "the attempt's failure")
    loop.wait_done(loop.submit(n=1))
    assert wrapper.host.proc is not None and wrapper.host.proc.pid != first_host
    with loop.services.pool.connection() as conn:
        row = conn.execute(
            "SELECT error FROM task_attempts WHERE task_id = %s AND attempt = 1", (sleeper,)
        ).fetchone()
    assert row is not None
    expected = said.format(leaver=leaver)
    if stray["type"] == "done":
        expected += f" during run '{sleeper}/1'"
    assert row["error"] == f"operator host broke the protocol: {expected}", row["error"]


def test_a_host_that_exits_after_its_end_does_not_fail_the_next_task(
    loop_of: Callable[[int], Loop], tmp_path: Any
) -> None:
    """A host that ends after an attempt's end (an operator's os._exit after its "done"; a
    clean-up that failed: host_main's exit 70) may still run when the tenant's next attempt is
    handed to it. Its exit, with that attempt's run line still unread in its input, is not
    that attempt's to die of: the attempt starts on a fresh host, its try not used. The exit is
    ordered after the hand-over here (the probe waits for a file): on a busy machine the host
    is merely slow to exit."""
    loop = loop_of(1)
    loop.start()
    loop.wait_done(loop.submit(n=1))  # the host runs: the next attempts start in the loop
    (wrapper,) = loop.wrappers
    assert wrapper.host.proc is not None
    first_host = wrapper.host.proc
    gate = tmp_path / "exit-now"
    end = {"type": "done", "final_events": []}
    (ender,) = loop.submit("probe", max_attempts=1, send=[end], then_exit=True, exit_when=str(gate))
    loop.wait_done([ender])
    (nxt,) = loop.submit(max_attempts=1)
    wait_for(
        lambda: wrapper.host.unread_input() > 0, 20, "the next run line in the live host's input"
    )
    assert first_host.poll() is None
    gate.touch()
    view = wait_for(
        lambda: (
            (v := loop.services.dispatcher.get_task(nxt)).status in ("failed", "succeeded") and v
        ),
        30,
        "the next task's end",
    )
    assert (view.status, view.attempt) == ("succeeded", 1), view.last_error
    assert first_host.returncode == 0
    assert wrapper.host.proc is not None and wrapper.host.proc.pid != first_host.pid


@pytest.mark.parametrize("exits", [1, 2])
def test_a_host_gone_before_it_is_handed_the_run_is_replaced_once(
    loop_of: Callable[[int], Loop], exits: int
) -> None:
    """A host that runs for the tenant at the start's `ensure` but has exited by the time the
    run is written to it (its pipe broken) did not run it: the attempt starts on a fresh host,
    its try not used. Once only: a fresh host gone as well fails the attempt."""
    loop = loop_of(1)
    loop.start()
    loop.wait_done(loop.submit(n=1))  # the host runs for the tenant: `ensure` keeps it
    (wrapper,) = loop.wrappers
    first_host = wrapper.host.proc
    assert first_host is not None
    # Started by its wrapper's thread (`run_claimed`), not at once in the loop.
    wrapper.start_ready = lambda claim, msg: None  # type: ignore[method-assign]
    send, sent = wrapper.host.send, []

    def exit_then_send(msg: Any, timeout: float = 30.0) -> None:
        sent.append(wrapper.host.proc)
        if len(sent) <= exits:  # it exits between `ensure` and the run's line
            assert wrapper.host.proc is not None
            wrapper.host.proc.kill()
            wrapper.host.proc.wait()
        send(msg, timeout)

    wrapper.host.send = exit_then_send  # type: ignore[method-assign]
    (task,) = loop.submit(max_attempts=1)
    view = wait_for(
        lambda: (
            (v := loop.services.dispatcher.get_task(task)).status in ("failed", "succeeded") and v
        ),
        30,
        "the task's end",
    )
    assert len(sent) == 2 and sent[0] is first_host and sent[1] is not first_host
    if exits == 1:
        assert (view.status, view.attempt) == ("succeeded", 1), view.last_error
    else:
        assert view.status == "failed", view.status
        assert "operator host failed to start" in (view.last_error or ""), view.last_error


def test_a_lambda_tasks_wakeup_on_the_task_queue_is_handed_back_not_run(
    loop_of: Callable[[int], Loop], tmp_path: Path
) -> None:
    """A lambda task is the Lambda invoker's alone: its wake-up on the platform workers' queue
    (forged, or left by an older version) is claimed and handed back at once (no try used),
    its operator never run on the worker; the Dispatcher wakes it again on the lambda queue."""
    loop = loop_of(1)
    ran = tmp_path / "ran"
    spec = TaskSpec(job="fn", operator="noop", runtime="lambda", config={"record_to": str(ran)})
    task_id = loop.services.dispatcher.create_task(spec).task_id
    loop.driver.publish(Q, wake(task_id))
    loop.start()
    wait_for(lambda: loop.status(task_id) == ("queued", 1), 30, "the claim handed back")
    assert not ran.exists()
    with loop.services.pool.connection() as conn:
        rows = conn.execute(
            "SELECT a.outcome, a.error, (SELECT count(*) FROM outbox o WHERE o.queue_name ="
            " 'lambda' AND o.payload->>'task_id' = %s) AS woken FROM task_attempts a"
            " WHERE a.task_id = %s",
            (str(task_id), task_id),
        ).fetchall()
    assert [(r["outcome"], r["woken"]) for r in rows] == [("released", 2)], rows
    assert "runtime lambda" in rows[0]["error"]
