"""The worker's loop: one thread drives all of a worker's wrappers.

Each turn: one queue receive for every idle wrapper (carrying the acks held since the last),
one exchange with the API carrying every claim and every finished attempt's report, the
claimed attempts handed to their hosts, then one wait on every running host's pipe. Short
attempts live their whole life here, without a thread hand-off: a thread per wrapper, each
waiting on its own call, cost each task about six thread wake-ups and the interpreter lock's
convoy (measured end to end at 2 workers x 8 wrappers, in interleaved runs: 26 context switches
and 3.4-3.9 ms of CPU a task, against 8 and 2.5-2.6 ms this way).

Whatever can wait goes to a thread of its own, which supervises the attempt to its end exactly
as a lone wrapper does (`Wrapper.supervised`): a start that needs the API or a host's start
(secrets, egress gateways, a Spark forward, another tenant's host), and a running attempt once
it asks anything but to finish (a store request, an event, its exit) or its first heartbeat is
due. The loop never waits on one attempt's behalf."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import ssl
import threading
import time
from collections.abc import Callable

from trace_platform.contract import Claim, ClaimRequest, CompleteItem, CompleteResponse
from trace_platform.metrics.worker import WorkerMetrics
from trace_platform.queue.driver import Message
from trace_platform.worker.attempt import LeaseClock, Running
from trace_platform.worker.client import (
    ApiError,
    Ask,
    DispatcherClient,
    complete_item,
    transient,
)
from trace_platform.worker.reports import (
    bounded_progress,
    clean_report,
    final_report,
    foreign,
    refused_report,
    reported,
)
from trace_platform.worker.wrapper import Wrapper

log = logging.getLogger(__name__)
# The loop's own calls to the API are tried once, within this many seconds: the loop tries
# again itself, and every attempt it runs waits while it waits.
EXCHANGE_SECONDS = 5.0
# How long a claim is tried again while the API is away (the last try a second before it ends,
# as for a lease).
CLAIM_RETRY_SECONDS = 5.0
# The longest the loop waits on its hosts before a new turn (which looks at `stop`).
LOOK_EVERY = 0.5
# The longest a receive waits on an empty queue, so the longest the loop goes without looking
# at `stop` (a signal's handler sets it, and a wait interrupted by a signal resumes).
RECEIVE_WAIT_MAX = 2.0
# While attempts run here and the queue was empty, it is asked again after this long,
# doubling up to IDLE_MAX (the receive cannot wait on the queue then: the hosts need watching).
IDLE_MIN, IDLE_MAX = 0.005, 0.2
# What one host's messages may take of a turn (one writing progress on cannot hold the loop).
MESSAGES_A_TURN = 64


def loop_client(
    api_url: str,
    internal_token: str,
    exchange_url: str | None,
    tls: ssl.SSLContext | None = None,
    metrics: WorkerMetrics | None = None,
) -> DispatcherClient:
    """The loop's client of the API (its threads keep the worker's, which retries), counting
    its answers in the worker's `metrics`."""
    return DispatcherClient(
        api_url,
        internal_token=internal_token,
        timeout=EXCHANGE_SECONDS,
        retries=0,
        wrappers=1,
        exchange_url=exchange_url,
        tls=tls,
        metrics=metrics,
    )


class _Claiming:
    """A wake-up being claimed for `wrapper`; after a transient failure, tried again (with
    the same request, so a claim whose answer was lost gets its lease) until `until`."""

    __slots__ = ("msg", "req", "retry_at", "until", "wrapper")

    def __init__(self, wrapper: Wrapper, msg: Message, req: ClaimRequest) -> None:
        self.wrapper, self.msg, self.req = wrapper, msg, req
        self.retry_at = 0.0
        self.until = time.monotonic() + CLAIM_RETRY_SECONDS


class _Report:
    """A finished attempt's report, until answered; then its wake-up is acked. Tried again
    after a transient failure while the lease holds (as `Wrapper._report`)."""

    __slots__ = ("claim", "clock", "item", "msg", "retry_at")

    def __init__(self, claim: Claim, msg: Message, item: CompleteItem, clock: LeaseClock) -> None:
        self.claim, self.msg, self.item, self.clock = claim, msg, item, clock
        self.retry_at = 0.0


class Reactor:
    def __init__(self, wrappers: list[Wrapper], client: DispatcherClient | None = None) -> None:
        """`wrappers`: one worker's, sharing one queue driver, API client and `HeldAcks`, with
        the same visibility and receive wait. `client`: the loop's own (`loop_client`), else
        the wrappers'."""
        first = wrappers[0]
        self.wrappers = wrappers
        self.client, self.acks = client or first.client, first.acks
        self.visibility = first.visibility
        self.wait_seconds = first.wait_seconds
        self.tasks_run = 0
        self.handoffs = 0  # attempts that went to their wrapper's thread
        self._lock = threading.Lock()  # `_idle`, `_away`: threads give wrappers back
        self._idle: list[Wrapper] = list(wrappers)
        self._away: set[Wrapper] = set()  # on their own thread, with an attempt
        self._jobs: dict[Wrapper, queue.SimpleQueue[Callable[[], None] | None]] = {}
        self._threads: list[threading.Thread] = []
        self._runs: dict[Wrapper, Running] = {}  # attempts running under this loop
        self._claiming: list[_Claiming] = []
        self._reports: list[_Report] = []
        self._unread: set[Wrapper] = set()  # running here, a turn's messages not all taken
        self._troubled = False  # the last exchange met the API away
        self._receive_at = 0.0  # after a failed receive: not before this
        self._receive_failures = 0  # in a row
        self._idle_wait = 0.0
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # -- the loop ------------------------------------------------------------------------
    def run(
        self,
        stop: threading.Event,
        max_tasks: int | None = None,
        abort: threading.Event | None = None,
    ) -> None:
        """Takes wake-ups until `stop` (or `max_tasks` claimed); a running attempt goes on
        until it ends or `abort` (then it is handed back unfinished). Without `abort`, `stop`
        is both. Returns once every attempt has ended and been reported."""
        abort = abort or stop
        failures = 0
        try:
            while True:
                if abort.is_set():
                    for wrapper in list(self._runs):
                        self._hand_off(wrapper, abort, beat_now=True)
                taking = not (stop.is_set() or abort.is_set())
                taking = taking and (max_tasks is None or self.tasks_run < max_tasks)
                if not taking and not self._busy():
                    return
                try:
                    want = self._wanted(max_tasks) if taking else 0
                    got = self._receive(want)
                    self._exchange(abort)
                    self._watch(self._timeout(want, got), abort)
                    failures = 0
                except Exception:  # never die: what is in flight is tried again
                    failures += 1
                    log.exception("worker loop error (%d in a row)", failures)
                    stop.wait(min(5.0, 0.1 * 2 ** min(failures, 6)))
        finally:
            self._close()

    def _busy(self) -> bool:
        with self._lock:
            away = bool(self._away)
        return away or bool(self._runs or self._claiming or self._reports)

    def _wanted(self, max_tasks: int | None) -> int:
        with self._lock:
            idle = len(self._idle)
        if max_tasks is not None:
            idle = min(idle, max_tasks - self.tasks_run - len(self._claiming))
        return max(0, idle) if time.monotonic() >= self._receive_at else 0

    def _receive(self, want: int) -> int:
        """Wake-ups for up to `want` idle wrappers (each then reserved for its claim). Waits
        on the queue only when nothing else needs the loop."""
        if not want:
            return 0
        waiting = self._runs or self._claiming or self._reports
        wait = 0.0 if waiting else min(self.wait_seconds, RECEIVE_WAIT_MAX)
        try:
            msgs = self.acks.receive(want, self.visibility, wait)
        except Exception:  # the database away: back off, never die
            self._receive_failures += 1
            n = self._receive_failures
            log.exception("worker loop: receive failed (%d in a row)", n)
            self._receive_at = time.monotonic() + min(30.0, 0.5 * 2 ** min(n, 6))
            return 0
        self._receive_failures = 0
        for msg in msgs:
            with self._lock:
                wrapper = self._idle.pop()
            task_id = wrapper.wakeup_task(msg)
            if task_id is None:  # not a wake-up: nacked
                self._give_back(wrapper)
                continue
            req = self.client.claim_request(task_id, wrapper.worker_id)
            self._claiming.append(_Claiming(wrapper, msg, req))
        return len(msgs)

    def _exchange(self, abort: threading.Event) -> None:
        """Every report and claim due, in one exchange with the API."""
        now = time.monotonic()
        reports = [r for r in self._reports if r.retry_at <= now]
        claims = [c for c in self._claiming if c.retry_at <= now]
        if not reports and not claims:
            return
        self._reports = [r for r in self._reports if r.retry_at > now]
        self._claiming = [c for c in self._claiming if c.retry_at > now]
        asks: list[Ask] = [(r.claim, r.item) for r in reports]
        asks += [c.req for c in claims]
        if self._troubled:
            # The last exchange met the API away, and this one may wait out its timeout: an
            # attempt whose heartbeat would come due meanwhile goes to its thread first.
            horizon = now + 2 * self.client.timeout
            for wrapper, run in list(self._runs.items()):
                if run.beat_at < horizon:
                    self._hand_off(wrapper, abort)
        answers = self.client.exchange(asks)
        self._troubled = any(isinstance(a, Exception) and transient(a) for a in answers)
        # Each answer on its own: one that fails to be taken loses none of the others.
        for report, answer in zip(reports, answers[: len(reports)], strict=True):
            try:
                self._reported(report, answer)
            except Exception as e:
                log.exception("task %s: report's answer not taken", report.claim.task_id)
                self._nack(report.msg, f"report failed: {e}")
        for claiming, answer in zip(claims, answers[len(reports) :], strict=True):
            try:
                self._claimed(claiming, answer, abort)
            except Exception as e:
                log.exception("task %s: claim's answer not taken", claiming.req.task_id)
                self._nack(claiming.msg, f"claim failed: {e}")
                if not self._placed(claiming.wrapper):
                    self._give_back(claiming.wrapper)

    def _reported(self, report: _Report, answer: object) -> None:
        """A report's answer: success, or the API away (tried again while the lease holds,
        else the wake-up is nacked and the reaper retries the attempt), or a refusal (a
        follow-up report when one is due)."""
        claim, outcome = report.claim, report.item.outcome
        if isinstance(answer, Exception) and transient(answer):
            left = report.clock.left()
            if left > 1.0:
                log.warning("completion failed (%s); retrying, %.0fs left", answer, left)
                report.retry_at = time.monotonic() + min(1.0, left / 4)
                self._reports.append(report)
            else:
                log.error(
                    "task %s attempt %s: report failed: %s", claim.task_id, claim.attempt, answer
                )
                self._nack(report.msg, f"report failed: {answer}")
            return
        if isinstance(answer, ApiError | ValueError):
            follow = refused_report(claim, outcome, answer)
            if follow is not None:
                self._report(claim, report.msg, "failed", report.clock, **follow)
                return  # acked once the follow-up is answered
        elif isinstance(answer, CompleteResponse):
            reported(claim, answer)
        else:  # not an answer the API gives: the reaper retries the attempt
            log.error("task %s attempt %s: report failed: %s", claim.task_id, claim.attempt, answer)
            self._nack(report.msg, f"report failed: {answer}")
            return
        self.acks.submit(report.msg.receipt)

    def _claimed(self, claiming: _Claiming, answer: object, abort: threading.Event) -> None:
        wrapper, msg = claiming.wrapper, claiming.msg
        if isinstance(answer, Claim):
            self.tasks_run += 1
            try:
                run = wrapper.start_ready(answer, msg)
            except Exception as e:  # its own thread tries again, and reports what it meets
                log.warning("task %s: could not start it at once: %s", answer.task_id, e)
                run = None
            if run is not None:
                self._runs[wrapper] = run
            else:
                self._spawn(wrapper, answer, msg, lambda: wrapper.run_claimed(answer, msg, abort))
            return
        error = answer if isinstance(answer, Exception) else RuntimeError(str(answer))
        if transient(error) and time.monotonic() < claiming.until - 1.0:
            log.warning("claim of %s failed (%s); retrying", claiming.req.task_id, error)
            claiming.retry_at = time.monotonic() + 0.5
            self._claiming.append(claiming)
            return
        if isinstance(error, ApiError):
            wrapper.refused_claim(msg, claiming.req.task_id, error)
        else:
            log.error("claim of %s failed: %s", claiming.req.task_id, error)
            self._nack(msg, f"claim failed: {error}")
        self._give_back(wrapper)

    def _nack(self, msg: Message, why: str) -> None:
        self.wrappers[0].nack(msg, why, delay_seconds=1)

    def _placed(self, wrapper: Wrapper) -> bool:
        """Whether `wrapper` is idle, running an attempt here, or away on one."""
        with self._lock:
            return wrapper in self._idle or wrapper in self._away or wrapper in self._runs

    def _report(
        self, claim: Claim, msg: Message, outcome: str, clock: LeaseClock, **kw: object
    ) -> None:
        try:
            item = complete_item(claim, outcome, **clean_report(kw))  # type: ignore[arg-type]
        except ValueError as e:  # refused by the client's own validation (too many events)
            follow = refused_report(claim, outcome, e)
            if follow is None:
                self.acks.submit(msg.receipt)
                return
            item = complete_item(claim, "failed", **follow)
        self._reports.append(_Report(claim, msg, item, clock))

    # -- the running attempts ------------------------------------------------------------
    def _timeout(self, want: int, got: int) -> float:
        """How long the loop may wait on the hosts before its next turn."""
        now = time.monotonic()
        due = [r.beat_at for r in self._runs.values()]
        due += [r.retry_at for r in self._reports] + [c.retry_at for c in self._claiming]
        timeout = min([LOOK_EVERY, *(d - now for d in due)])
        if want and (self._runs or self._claiming or self._reports):
            # The receive could not wait on the queue (the hosts, or a retry, need the loop):
            # wake-ups are asked for again at once while they come, later and later while not.
            self._idle_wait = 0.0 if got else min(IDLE_MAX, max(IDLE_MIN, 2 * self._idle_wait))
            timeout = min(timeout, self._idle_wait)
        elif want:
            timeout = 0.0  # the receive itself waited on the queue
        return max(0.0, timeout)

    def _watch(self, timeout: float, abort: threading.Event) -> None:
        """Waits up to `timeout` for any running host to say something, and takes what they
        said; an attempt whose heartbeat is due goes to its own thread."""
        poll = select.poll()
        poll.register(self._wake_r, select.POLLIN)
        by_fd: dict[int, Wrapper] = {}
        for wrapper, run in self._runs.items():
            assert run.host.link is not None
            for fd in run.host.link.fds():
                poll.register(fd, select.POLLIN)
                by_fd[fd] = wrapper
        if self._unread:  # lines already read off a pipe, waiting to be taken
            timeout = 0.0
        ready = {by_fd.get(fd) for fd, _ in poll.poll(timeout * 1000)}
        ready |= self._unread
        self._unread = set()
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        for wrapper in ready:
            if wrapper is not None and wrapper in self._runs:
                self._heard(wrapper, abort)
        now = time.monotonic()
        for wrapper, run in list(self._runs.items()):
            if now >= run.beat_at:
                self._hand_off(wrapper, abort)

    def _heard(self, wrapper: Wrapper, abort: threading.Event) -> None:
        run = self._runs[wrapper]
        link = run.host.link
        assert link is not None
        for _ in range(MESSAGES_A_TURN):
            out = link.get(0)
            if out is None:
                return
            kind = out.get("type")
            if foreign(out, run) is not None:  # its thread meets it, as a lone wrapper does
                self._hand_off(wrapper, abort, first=out)
                return
            if kind == "progress":
                run.progress = bounded_progress(out.get("progress"), run.claim)
                continue
            if kind in ("done", "failed"):
                try:
                    outcome, kw = final_report(out, run.task)
                except Exception:  # malformed: its thread meets it, as a lone wrapper does
                    self._hand_off(wrapper, abort, first=out)
                    return
                del self._runs[wrapper]
                wrapper.finish(run)
                self._give_back(wrapper)  # its host is free: the next attempt may start
                self._report(run.claim, run.msg, outcome, run.clock, **kw)
                return
            # Anything else (a store request, an event, its exit) takes waiting on: the
            # attempt's own thread answers it, and supervises it from now on.
            self._hand_off(wrapper, abort, first=out)
            return
        self._unread.add(wrapper)  # more may be read already: taken next turn, at once

    def _hand_off(
        self,
        wrapper: Wrapper,
        abort: threading.Event,
        first: dict[str, object] | None = None,
        beat_now: bool = False,
    ) -> None:
        run = self._runs.pop(wrapper)
        if beat_now:
            run.beat_at = 0.0
        self._spawn(wrapper, run.claim, run.msg, lambda: wrapper.supervised(run, abort, first))

    # -- threads -------------------------------------------------------------------------
    def _spawn(
        self, wrapper: Wrapper, claim: Claim, msg: Message, attempt: Callable[[], None]
    ) -> None:
        """The attempt on its wrapper's own thread; the wrapper comes back when it ends. The
        thread lives as long as the loop: a host it starts dies with it (the host's parent
        death signal follows the thread that started it, not the process)."""

        def body() -> None:
            try:
                wrapper.attempt(claim, msg, attempt)
            finally:
                with self._lock:
                    self._away.discard(wrapper)
                self._give_back(wrapper)

        self.handoffs += 1
        with self._lock:
            self._away.add(wrapper)
            jobs = self._jobs.get(wrapper)
            if jobs is None:
                jobs = self._jobs[wrapper] = queue.SimpleQueue()
                thread = threading.Thread(
                    target=_serve, args=(jobs,), name=f"wrapper-{len(self._jobs)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        jobs.put(body)

    def _give_back(self, wrapper: Wrapper) -> None:
        with self._lock:
            self._idle.append(wrapper)
        with contextlib.suppress(BlockingIOError):  # a wake-up already pending is enough
            os.write(self._wake_w, b"\0")

    def _close(self) -> None:
        """On the way out (an error of the loop itself included): every attempt's thread
        ends first (each is handed back on `abort`), then the held acks go out."""
        for wrapper in list(self._runs):  # only on an error: the loop ends with none
            run = self._runs.pop(wrapper)
            wrapper.close()
            wrapper.finish(run)
        for jobs in self._jobs.values():
            jobs.put(None)
        for thread in self._threads:
            thread.join()
        try:  # the last wake-ups' acks (else they are delivered again, and dropped)
            self.acks.flush()
        except Exception as e:
            log.warning("could not ack the last wake-ups: %s", e)
        for wrapper in self.wrappers:
            wrapper.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def _serve(jobs: queue.SimpleQueue[Callable[[], None] | None]) -> None:
    """A wrapper's thread: its jobs, one at a time, until None. A job's error ends the job
    only (the thread must live on: the hosts it started die with it)."""
    while (job := jobs.get()) is not None:
        try:
            job()
        except Exception:
            log.exception("a wrapper's job failed")
