"""A worker's membership in the worker registry (dispatcher/fleet.py): registered on start,
a beat every `beat_seconds` from a thread of its own (whatever its attempts and its loop are
doing), stopped on a clean exit. All through the internal API, as a worker on another host
reaches nothing else.

A worker the registry declared dead (its beats stopped reaching the API for three intervals:
it hung, or the network between them failed) has lost its running attempts, which were retried
elsewhere; it is told so at its next beat and stops (`on_dead`), to be started again as a new
worker. Whatever it still sends for those attempts lands nothing."""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from trace_platform.config import HOST_NAME, Settings
from trace_platform.contract_fleet import WorkerRegistration
from trace_platform.worker.client import ApiError, DispatcherClient

log = logging.getLogger(__name__)


def trace_version() -> str:
    try:
        return version("trace-platform")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def advertised_host(settings: Settings) -> str:
    """The host name a worker registers under: TRACE_WORKER_HOST, else this machine's; a
    ValueError for one the registry would refuse."""
    host = settings.worker_host or socket.gethostname()
    if not re.match(HOST_NAME, host):
        raise ValueError(
            f"this host's name {host!r} is not one a worker may advertise: set TRACE_WORKER_HOST"
        )
    return host


def new_worker_id(host: str) -> str:
    """host:pid:nonce: the host it advertises, its process, and a nonce (a pid is reused)."""
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Membership:
    def __init__(
        self,
        client: DispatcherClient,
        *,
        host: str,
        slots: int,
        beat_seconds: float,
        on_dead: Callable[[str], None],
        worker_id: str | None = None,
    ) -> None:
        """`on_dead(why)`: called once, from the beat thread, when the registry says this
        worker was declared dead."""
        self.client = client
        self.worker_id = worker_id or new_worker_id(host)
        self.registration = WorkerRegistration(
            worker_id=self.worker_id,
            host=host,
            pid=os.getpid(),
            version=trace_version(),
            slots=slots,
            beat_seconds=beat_seconds,
        )
        self.beat_seconds = beat_seconds
        # A call's own bound: a slow answer delays the next beat, never piles them up.
        self.timeout = max(1.0, min(2 * beat_seconds, 10.0))
        self.on_dead = on_dead
        self.registered = False
        # Once the registry answered, it exists: a 404 or 405 after that is passing (a proxy's
        # page while the API restarts behind it), never "an API without a registry".
        self.known = False
        self.dead: str | None = None  # why, once declared dead
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-beat", daemon=True)

    def start(self) -> Membership:
        """Registers (once here: while the API cannot be reached, the beat thread tries again
        at each beat) and starts beating."""
        if self._beat():
            self._thread.start()
        return self

    def stop(self) -> None:
        """A clean exit: beats end and the worker is listed stopped (a dead one stays dead)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout + 1)
        if not self.registered or self.dead is not None:
            return
        try:
            self.client.worker_stopped(self.worker_id, self.timeout)
        except Exception as e:  # it is declared dead in three beats instead
            log.warning("could not mark worker %s stopped: %s", self.worker_id, e)

    def _run(self) -> None:
        next_at = time.monotonic() + self.beat_seconds
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            # On schedule, not `beat_seconds` after the last answer (a slow answer would make
            # every later beat late); a beat already late starts the schedule again.
            next_at = max(next_at + self.beat_seconds, time.monotonic())
            if not self._beat():
                return

    def _beat(self) -> bool:
        """One registration or beat; False: this worker is done beating."""
        try:
            if self.registered:
                self.client.worker_beat(self.worker_id, self.timeout)
            else:
                self.client.register_worker(self.registration, self.timeout)
                self.registered = True
                log.info("registered as worker %s", self.worker_id)
            self.known = True
            return True
        except ApiError as e:
            if e.code in ("worker_dead", "worker_stopped", "worker_id_taken"):
                self.dead = e.message
                log.error("the worker registry ended this worker: %s", e.message)
                self.on_dead(e.message)
                return False
            if e.status == 404 and self.registered:  # the registry lost it: register again
                self.registered = False
                return True
            if e.status in (404, 405) and not self.known:  # an API from before the registry
                log.warning("the API has no worker registry (%s); not beating", e)
                return False
            log.warning("worker beat refused: %s", e)
        except Exception as e:  # the API away: the next beat tries again
            log.warning("worker beat failed: %s", e)
        return True
