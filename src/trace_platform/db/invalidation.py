"""One LISTEN connection per process on `trace_invalidate`: the database announces a change to
what a mutable cache holds (migration 0035's triggers, payload `kind:what`, e.g.
`api_key:<digest>` or `user:<uuid>`) and the listener hands it to the caches registered for
that kind.

A cache of mutable answers is trusted only while `live`: from the moment LISTEN is in place
until the connection is lost. On a loss (the server gone, the backend terminated, a ping that
fails) every registered cache is cleared, readers go to the database, and the listener
connects again and clears once more after its new LISTEN (announcements in between were never
heard). A silent network loss is noticed by the ping every `ping_seconds` (with TCP keepalives
and a TCP user timeout on the connection)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

log = logging.getLogger(__name__)

CHANNEL = "trace_invalidate"


class InvalidationListener:
    def __init__(self, dsn: str, *, ping_seconds: float = 1.0, retry_seconds: float = 0.5) -> None:
        self.dsn = dsn
        self.ping_seconds = ping_seconds
        self.retry_seconds = retry_seconds
        self._handlers: dict[str, list[Callable[[str], None]]] = {}
        self._resets: list[Callable[[], None]] = []
        self._live = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
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
        return self._live.is_set()

    def wait_live(self, timeout: float) -> bool:
        return self._live.wait(timeout)

    def start(self) -> InvalidationListener:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="cache-invalidation", daemon=True
                )
                self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=self.ping_seconds + 5)

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
        with psycopg.connect(
            self.dsn,
            autocommit=True,
            connect_timeout=5,
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=2,
            tcp_user_timeout=int((self.ping_seconds + 2) * 1000),
        ) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            # Anything cached before this LISTEN may have missed its announcement.
            self._reset()
            self.backend_pid = conn.info.backend_pid
            self._live.set()
            while not self._stop.is_set():
                for note in conn.notifies(timeout=self.ping_seconds):
                    self._dispatch(note.payload)
                conn.execute("SELECT 1")  # notices a connection that died silently

    def _dispatch(self, payload: str) -> None:
        kind, _, what = payload.partition(":")
        for handler in self._handlers.get(kind, ()):
            handler(what)

    def _reset(self) -> None:
        for clear in self._resets:
            clear()
