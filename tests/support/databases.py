"""Fresh databases cloned from the migrated template, the next one made on a thread while the
current test runs: a clone takes about half a second of the server's time, which the test
would otherwise wait for, over a thousand times a run."""

from __future__ import annotations

import queue
import threading
import uuid

import psycopg
from psycopg import sql

READY = 1  # clones made ahead: one is enough to hide the wait; more would idle on disk


def with_db(dsn: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=dbname)


class Databases:
    def __init__(self, server: str, template: str) -> None:
        self.server, self.template = server, template
        self._ready: queue.Queue[str | BaseException] = queue.Queue(maxsize=READY)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="test-databases", daemon=True)
        self._thread.start()

    def _create(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.server, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self.template)
                )
            )
        return name

    def _fill(self) -> None:
        while not self._closed.is_set():
            made: str | BaseException
            try:
                made = self._create()
            except BaseException as e:  # handed to the test that asks next, which fails with it
                made = e
            while not self._closed.is_set():
                try:
                    self._ready.put(made, timeout=0.5)
                    break
                except queue.Full:
                    continue
            if isinstance(made, BaseException):
                return

    def take(self) -> str:
        """A fresh database's DSN (waits for the clone under way, if any)."""
        made = self._ready.get(timeout=300)
        if isinstance(made, BaseException):
            raise RuntimeError(f"could not clone {self.template}: {made}") from made
        return with_db(self.server, made)

    def drop(self, dsn: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        with psycopg.connect(self.server, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name)))
            )

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=30)
        while True:  # a clone made ahead that no test took
            try:
                made = self._ready.get_nowait()
            except queue.Empty:
                return
            if isinstance(made, str):
                self.drop(with_db(self.server, made))
