"""One LISTEN connection per process on `trace_invalidate`: the database announces a change to
what a mutable cache holds (migration 0035's triggers, payload `kind:what`, e.g.
`api_key:<digest>` or `user:<uuid>`) and the listener hands it to the caches registered for
that kind.

A cache of mutable answers is trusted only while `live`: LISTEN is in place and the server
answered a ping sent less than `trust_seconds` ago. A ping's answer comes after every
announcement committed before it was sent, so while `live`, whatever changed more than
`trust_seconds` ago has been heard. A peer that stops answering without closing the connection
(a stalled proxy or NAT, a hung server: the kernel still acknowledges, so neither TCP keepalives
nor the TCP user timeout notice) makes the listener not `live` within `trust_seconds`, and a
watchdog severs the connection once a ping went unanswered for `dead_seconds`.

On a loss (the server gone, the backend terminated, a ping that fails or hangs) every
registered cache is cleared, readers go to the database, and the listener connects again and
clears once more after its new LISTEN (announcements in between were never heard)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

log = logging.getLogger(__name__)

CHANNEL = "trace_invalidate"


class InvalidationListener:
    def __init__(
        self,
        dsn: str,
        *,
        ping_seconds: float = 0.25,
        trust_seconds: float = 1.0,
        dead_seconds: float = 5.0,
        retry_seconds: float = 0.5,
    ) -> None:
        if not 0 < ping_seconds < trust_seconds < dead_seconds:
            raise ValueError("0 < ping_seconds < trust_seconds < dead_seconds")
        self.dsn = dsn
        self.ping_seconds = ping_seconds
        self.trust_seconds = trust_seconds
        self.dead_seconds = dead_seconds
        self.retry_seconds = retry_seconds
        self._handlers: dict[str, list[Callable[[str], None]]] = {}
        self._resets: list[Callable[[], None]] = []
        self._live = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # time.monotonic() when the last ping the server answered was sent: everything
        # announced before then has been handed to the caches.
        self._heard_until = float("-inf")
        self._conn: psycopg.Connection[Any] | None = None  # under _lock: the watchdog's
        self.backend_pid: int | None = None  # the listening session's (tests end it)
        self.losses = 0  # connections lost (and caches cleared for it)

    def on(self, kind: str, handler: Callable[[str], None]) -> None:
        """`handler(what)` for every announcement `kind:what`."""
        self._handlers.setdefault(kind, []).append(handler)

    def on_reset(self, clear: Callable[[], None]) -> None:
        """`clear()` whenever announcements may have been missed."""
        self._resets.append(clear)

    @property
    def live(self) -> bool:
        return self._live.is_set() and time.monotonic() - self._heard_until < self.trust_seconds

    def wait_live(self, timeout: float) -> bool:
        return self._live.wait(timeout)

    def start(self) -> InvalidationListener:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="cache-invalidation", daemon=True
                )
                self._thread.start()
                threading.Thread(
                    target=self._watch, name="cache-invalidation-watchdog", daemon=True
                ).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=self.dead_seconds + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except psycopg.Error as e:
                if not self._stop.is_set():
                    log.warning("cache invalidation listener lost its connection: %s", e)
            except Exception:  # a handler's bug must not leave the caches trusted unheard
                log.exception("cache invalidation listener failed")
            finally:
                if self._live.is_set():
                    self.losses += 1
                self._live.clear()
                self._reset()
            self._stop.wait(self.retry_seconds)

    def _listen(self) -> None:
        conn = psycopg.connect(
            self.dsn,
            autocommit=True,
            connect_timeout=5,
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=2,
            tcp_user_timeout=int(self.dead_seconds * 1000),
        )
        with self._lock:
            self._conn = conn
        try:
            self._heard_until = time.monotonic()  # the watchdog's clock for the LISTEN
            conn.execute(f"LISTEN {CHANNEL}")
            # Anything cached before this LISTEN may have missed its announcement.
            self._reset()
            self.backend_pid = conn.info.backend_pid
            self._live.set()
            while not self._stop.is_set():
                sent = time.monotonic()
                conn.execute("SELECT 1")  # its answer follows every earlier announcement
                for note in conn.notifies(timeout=0):  # those, handed over before trusting
                    self._dispatch(note.payload)
                self._heard_until = sent
                for note in conn.notifies(timeout=self.ping_seconds):
                    self._dispatch(note.payload)
        finally:
            with self._lock:  # before close: the watchdog never touches a reused descriptor
                self._conn = None
            conn.close()

    def _watch(self) -> None:
        """Severs a connection whose ping went unanswered for `dead_seconds`: psycopg waits
        for an answer without a deadline, and a silent peer never sends one."""
        severed: object = None
        while not self._stop.wait(self.ping_seconds):
            if time.monotonic() - self._heard_until < self.dead_seconds:
                continue
            with self._lock:
                if self._conn is None or self._conn is severed:
                    continue
                severed = self._conn
                log.warning(
                    "cache invalidation listener: no answer for %.0f s, reconnecting",
                    self.dead_seconds,
                )
                try:  # the listener's blocked read then ends at once, with an error
                    with socket.socket(fileno=os.dup(self._conn.pgconn.socket)) as s:
                        s.shutdown(socket.SHUT_RDWR)
                except (OSError, psycopg.Error):
                    pass

    def _dispatch(self, payload: str) -> None:
        kind, _, what = payload.partition(":")
        for handler in self._handlers.get(kind, ()):
            handler(what)

    def _reset(self) -> None:
        for clear in self._resets:
            clear()
