"""One claimed attempt: where its lease ends, when it beats, the heartbeats while it is set up,
and the run its operator host is handed."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from trace_platform.contract import Claim, TaskPayload
from trace_platform.queue.driver import Message
from trace_platform.sandbox.gateway import Gateways
from trace_platform.sandbox.hostdir import TaskDirs
from trace_platform.sandbox.tcp_forward import TcpForward
from trace_platform.worker.client import DispatcherClient, transient
from trace_platform.worker.operator_host import OperatorHost
from trace_platform.worker.store_proxy import ScopedStore

log = logging.getLogger(__name__)
T = TypeVar("T")


class LeaseClock:
    """Where this worker's lease ends, on its own monotonic clock: each accepted heartbeat
    moves it to the `lease_until` the Dispatcher answered (taken as a span from now, so a skew
    between the worker's and the database's clocks shifts it by no more than the skew)."""

    def __init__(self, lease_until: datetime) -> None:
        self.deadline = 0.0
        self.renew(lease_until)

    def renew(self, lease_until: datetime) -> None:
        span = (lease_until - datetime.now(UTC)).total_seconds()
        self.deadline = time.monotonic() + max(0.0, span)

    def left(self) -> float:
        return self.deadline - time.monotonic()


def within_lease(clock: LeaseClock | None, what: str, call: Callable[[], T]) -> T:
    """`call`, tried again while the API is away and `clock` still runs: the lease (an outage
    shorter than the lease costs the attempt nothing), or a claim's retry budget."""
    while True:
        try:
            return call()
        except Exception as e:
            if clock is None or not transient(e) or clock.left() <= 1.0:
                raise
            log.warning("%s failed (%s); retrying, %.0fs left", what, e, clock.left())
            time.sleep(min(1.0, clock.left() / 4))


def beat_every(claim: Claim, visibility: float) -> float:
    """Seconds between an attempt's heartbeats (each also extends its wake-up's visibility)."""
    return max(0.2, min(claim.heartbeat_seconds, visibility / 3))


class Running:
    """An attempt its host runs, and what supervising it needs."""

    __slots__ = (
        "beat_at",
        "claim",
        "clock",
        "dirs",
        "gateways",
        "host",
        "label",
        "msg",
        "progress",
        "scoped",
        "task",
    )

    def __init__(
        self,
        claim: Claim,
        msg: Message,
        task: TaskPayload,
        host: OperatorHost,
        dirs: TaskDirs,
        gateways: list[Gateways | TcpForward],
        scoped: ScopedStore,
        visibility: float = 60.0,
    ) -> None:
        self.claim, self.msg, self.task, self.host = claim, msg, task, host
        self.dirs, self.gateways, self.scoped = dirs, gateways, scoped
        self.label = f"{claim.task_id}/{claim.attempt}"  # the host's messages name it
        self.clock = LeaseClock(claim.lease_until)
        self.beat_at = time.monotonic() + beat_every(claim, visibility)  # the next heartbeat
        self.progress: dict[str, Any] | None = None  # the operator's last report of it


def run_message(run: Running, env: dict[str, str], spark_remote: str | None) -> bytes:
    """The host's "run" line. The payload goes in as pydantic writes it, in one pass (a dict
    first, then json, took 26 us a task against 16, in the loop every attempt waits on)."""
    head = json.dumps(
        {
            "type": "run",
            "run": run.label,
            "env": env,
            "workdir": str(run.dirs.work),
            "spark_remote": spark_remote,
        }
    )
    return f'{head[:-1]}, "task": {run.task.model_dump_json()}}}\n'.encode()


class SetupBeats:
    """An attempt's heartbeats, on a thread of their own, while the attempt is set up (before
    its supervisor beats): `lost` says why the lease is gone, `canceled` that a cancel came;
    `clock` and `next_at` carry on into the supervision."""

    def __init__(
        self,
        client: DispatcherClient,
        claim: Claim,
        visibility: float,
        extend: Callable[[], None],
        after: Running | None = None,
    ) -> None:
        """`extend`: keeps the attempt's wake-up invisible, after each accepted heartbeat;
        `after`: the attempt's earlier start (a retake), whose lease clock and heartbeat
        schedule carry on."""
        self.client, self.claim, self.extend = client, claim, extend
        self.clock = LeaseClock(claim.lease_until) if after is None else after.clock
        self.every = beat_every(claim, visibility)
        self.next_at = time.monotonic() + self.every if after is None else after.beat_at
        self.lost: str | None = None
        self.canceled = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="setup-beats", daemon=True)

    def __enter__(self) -> SetupBeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()  # at most one heartbeat call in flight

    def _run(self) -> None:
        while not self._done.wait(max(0.0, self.next_at - time.monotonic())):
            self.next_at = time.monotonic() + self.every
            try:
                hb = self.client.heartbeat(
                    self.claim, None, timeout=min(5.0, max(1.0, 2 * self.every))
                )
            except Exception as e:
                if not transient(e) or self.clock.left() <= self.every:
                    self.lost = str(e)
                    return
                self.next_at = time.monotonic() + min(self.every, 1.0)  # the API away: soon
                continue
            self.clock.renew(hb.lease_until)
            self.extend()
            if hb.cancel_requested:
                self.canceled = True
                return
