"""Supervising a running attempt: its heartbeats, its host's messages (store calls served off
the loop, events forwarded, the outcome reported), and the clean-up after it."""

from __future__ import annotations

import logging
import queue as stdqueue
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from trace_platform.contract import BufferPublishBody, Claim, EventIn
from trace_platform.queue.driver import Message
from trace_platform.sandbox.gateway import Gateways
from trace_platform.sandbox.hostdir import TaskDirs
from trace_platform.sandbox.tcp_forward import TcpForward
from trace_platform.worker.attempt import LeaseClock, Running, beat_every
from trace_platform.worker.client import ApiError, DispatcherClient, transient
from trace_platform.worker.host_link import HostLink
from trace_platform.worker.operator_host import HostUnresponsive, write_msg
from trace_platform.worker.reports import (
    bounded_progress,
    exit_reason,
    final_report,
    foreign,
    gist,
    one_line,
)
from trace_platform.worker.store_proxy import ScopedStore

log = logging.getLogger(__name__)


class _Janitor:
    """Removes finished tasks' directories off the wrappers' path: each is a fresh name under
    its host's directory, never reused, so the next task need not wait for the last one's
    rmtree (a host's kill removes whatever is left with its whole directory)."""

    def __init__(self) -> None:
        self._todo: stdqueue.Queue[TaskDirs] = stdqueue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def remove(self, dirs: TaskDirs) -> None:
        self._todo.put(dirs)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="task-dirs", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._todo.get().remove()


_janitor = _Janitor()


class Supervisor:
    """Supervising a started attempt to its end (a mixin of `Wrapper`): heartbeats and the
    wake-up's visibility on time, the host's messages read and answered, one report at the end."""

    client: DispatcherClient
    visibility: float

    if TYPE_CHECKING:  # the wrapper's own; declared so the loop below reads typed

        def _extend(self, msg: Message) -> None: ...

        def _report(
            self, claim: Claim, outcome: str, clock: LeaseClock | None = None, **kw: Any
        ) -> None: ...

        def run_claimed(
            self, claim: Claim, msg: Message, stop: threading.Event, after: Running | None = None
        ) -> None: ...

    def supervised(
        self,
        run: Running,
        stop: threading.Event,
        first: dict[str, Any] | None = None,
        retake: bool = True,
    ) -> None:
        """`run` supervised to its end and reported (`first`: a message already read). A host
        that exited before it read the run (one that ended after the tenant's last task: an
        operator's os._exit after its end, a clean-up that failed) did not run it: the attempt
        starts again on a fresh host (`retake`: once), its try not used, its lease clock and
        heartbeats carried on."""
        try:
            untaken = self._supervise(run, stop, first)
        finally:
            self.finish(run)
        if untaken and retake:
            self.run_claimed(run.claim, run.msg, stop, after=run)

    def finish(self, run: Running) -> None:
        # A run that never asked the store anything (a late answer could still write into
        # its inbox) and left its directories as made: they serve the host's next run.
        kept = not run.scoped.used and run.host.recycle(run.dirs)
        self._close(run.gateways, None if kept else run.dirs)

    @staticmethod
    def _serve_store(
        proc: subprocess.Popen[bytes],
        link: HostLink,
        scoped: ScopedStore,
        req: dict[str, Any],
    ) -> None:
        """Answers `proc`, the host that asked (never a restarted one), via its own link."""
        reply = {"type": "store_reply", **scoped.handle(req)}
        # Posted before the reply is written: the host's next request can only follow the
        # reply, so the supervisor always reads it after this.
        link.post({"type": "store_done"})
        try:
            write_msg(proc, reply)
        except HostUnresponsive as e:
            link.post({"type": "protocol_error", "error": str(e)})
        except OSError:  # the host is gone (killed: BrokenPipeError): nothing to answer
            return

    @staticmethod
    def _close(gateways: list[Gateways | TcpForward], dirs: TaskDirs | None) -> None:
        for gw in gateways:
            gw.close()
        if dirs is not None:
            _janitor.remove(dirs)

    def _broken(self, run: Running, why: str, retryable: bool = False) -> None:
        """The host said what the protocol does not allow: it is stopped and the attempt fails
        now, not when its lease runs out; for good (a host that broke the protocol once would
        again) unless `retryable` (the fault was an earlier task's: the retry gets a fresh
        host)."""
        why = one_line(str(why), 300)  # the host's own words, maybe: bounded, one line
        log.warning("task %s: host protocol violation: %s", run.claim.task_id, why)
        run.host.kill()
        self._report(
            run.claim,
            "failed",
            clock=run.clock,
            error=f"operator host broke the protocol: {why}",
            retryable=retryable,
        )

    def _supervise(
        self, run: Running, stop: threading.Event, first: dict[str, Any] | None = None
    ) -> bool:
        """True: the host exited before it read the run (nothing reported)."""
        claim, msg, task, host, scoped = run.claim, run.msg, run.task, run.host, run.scoped
        every = beat_every(claim, self.visibility)
        next_beat = run.beat_at
        progress = run.progress
        store_busy = False
        clock = run.clock
        link = host.link
        assert link is not None  # the host runs: `ensure` made it
        while True:
            if first is not None:
                out, first = first, None
            else:
                out = link.get(timeout=max(0.0, next_beat - time.monotonic()))
            if out is None or time.monotonic() >= next_beat:
                next_beat = time.monotonic() + every
                try:
                    hb = self.client.heartbeat(
                        claim, progress, timeout=min(5.0, max(1.0, 2 * every))
                    )
                except Exception as e:
                    if not transient(e):  # lease lost (reaped) or superseded: stop at once
                        log.warning(
                            "task %s attempt %s: %s; stopping operator",
                            claim.task_id,
                            claim.attempt,
                            e,
                        )
                        host.kill()
                        return False
                    if clock.left() <= every:  # lost before the next try: the reaper's now
                        log.warning(
                            "task %s attempt %s: no heartbeat accepted before the lease ran out "
                            "(%s); stopping operator",
                            claim.task_id,
                            claim.attempt,
                            e,
                        )
                        host.kill()
                        return False
                    # The API is away (restarting, unreachable): the lease still holds, so the
                    # operator goes on and the heartbeat is tried again soon.
                    log.warning(
                        "task %s attempt %s: heartbeat failed (%s); lease holds %.0fs more",
                        claim.task_id,
                        claim.attempt,
                        e,
                        clock.left(),
                    )
                    next_beat = time.monotonic() + min(every, 1.0)
                    hb = None
                if hb is not None:
                    clock.renew(hb.lease_until)
                    self._extend(msg)
                    if hb.cancel_requested or stop.is_set():
                        host.kill()
                        if hb.cancel_requested:
                            self._report(claim, "canceled", clock=clock)
                        else:  # shutting down, its drain grace over: not the task's failure
                            self._report(
                                claim,
                                "released",
                                clock=clock,
                                error="handed back unfinished: its worker shut down",
                            )
                        return False
            if out is None:
                continue
            kind = out.get("type")
            if (why := foreign(out, run)) is not None:
                # Retryable, but a failure: code in the host can name any run, and a
                # hand-back (`released`, no try used, queued at once) could be replayed forever.
                self._broken(run, why, retryable=True)
                return False
            if kind == "store" and not store_busy:
                # Served off this loop (heartbeats go on during an upload), one at a time.
                store_busy = True
                scoped.used = True
                threading.Thread(
                    target=self._serve_store,
                    args=(host.proc, link, scoped, out),
                    daemon=True,
                ).start()
            elif kind == "store_done":
                store_busy = False
            elif kind in ("store", "protocol_error"):
                why = out.get("error") or "a second store request before the first was answered"
                self._broken(run, why)
                return False
            elif kind == "progress":
                progress = bounded_progress(out.get("progress"), claim)
            elif kind == "event":
                try:
                    event = EventIn.model_validate(out.get("event"))
                    event.model_dump_json()  # the events call's body (its serializer's depth)
                except ValueError as e:
                    self._broken(run, f"a malformed event: {gist(e)}")
                    return False
                try:
                    self._within_lease(
                        clock, "events", lambda ev=event: self.client.events(claim, [ev])
                    )
                except ApiError as e:
                    log.warning("event refused for %s: %s; stopping operator", claim.task_id, e)
                    host.kill()
                    retryable = e.status not in (403, 422)
                    self._report(
                        claim,
                        "failed",
                        clock=clock,
                        error=f"event refused: {e.message}",
                        retryable=retryable,
                    )
                    return False
            elif kind == "buffer":
                # A batch the operator wrote for a buffered dataset: the wrapper, never the
                # operator, publishes its pointer (attempt-fenced), before the completion.
                try:
                    body = BufferPublishBody.model_validate(out.get("buffer"))
                except ValueError as e:
                    self._broken(run, f"a malformed buffer publish: {gist(e)}")
                    return False
                try:
                    self._within_lease(
                        clock, "buffer publish", lambda b=body: self.client.buffer_publish(claim, b)
                    )
                except ApiError as e:
                    log.warning("buffer publish refused for %s: %s", claim.task_id, e)
                    host.kill()
                    self._report(
                        claim,
                        "failed",
                        clock=clock,
                        error=f"buffer publish refused: {e.message}",
                        retryable=e.status not in (403, 422),
                    )
                    return False
            elif kind in ("done", "failed"):
                try:
                    outcome, kw = final_report(out, task)
                except Exception as e:  # as the loop's `_heard`: any fault of the message
                    self._broken(run, f"a malformed {kind!r} message: {gist(e)}")
                    return False
                self._report(claim, outcome, clock=clock, **kw)
                if store_busy:
                    # It ended with a store call of its own still open (a thread left
                    # running): that call's reply, or its note, must not reach the host's
                    # next task, nor the call read that task's run line. No reuse.
                    host.kill()
                return False
            elif kind == "exit":
                # The run line still (partly) in its input, and no store call answered since:
                # the host never took this run (a store reply is only written to a run's call).
                untaken = not scoped.used and host.unread_input() > 0
                host.kill()  # one that closed its output may still run
                if untaken:
                    log.warning(
                        "task %s: its operator host exited before it read the run (%s); "
                        "starting it on a fresh host",
                        claim.task_id,
                        exit_reason(out["returncode"]),
                    )
                    run.beat_at = next_beat  # the retake's heartbeats carry on from here
                    return True
                why, tail = exit_reason(out["returncode"]), host.log_tail()
                self._report(
                    claim,
                    "failed",
                    clock=clock,
                    error=f"operator process died ({why})\n{tail}".strip(),
                )
                return False
            else:  # `ready`, `store_reply` or any other: not what a running task may say
                why = f"a message of unknown type {one_line(kind, 40)!r}"
                # Naming another run, it is what an earlier task left running (as `foreign`).
                self._broken(run, why, retryable=out.get("run") not in (None, run.label))
                return False
