"""Group commit for heartbeats: the heartbeats that arrive while one is being written go
together in the next statement (`heartbeat_many`), one round trip and one commit for all.

A heartbeat alone is written at once by its own caller (no timer, no wait for company); under
load, each caller's heartbeat waits at most for the batch in flight, then leads the next one or
is written in it. The Postgres cost of a heartbeat is mostly per statement and per commit, not
per row: batching is how one process writes thousands a second (bench/tracking_bench.py)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from trace_platform.store.tasks.params import HeartbeatParams

Row = dict[str, Any]
MAX_BATCH = 500  # heartbeats a statement: bounded, so one batch's arrays stay small


@dataclass(slots=True)
class _Beat:
    params: HeartbeatParams
    woken: threading.Condition  # on the batcher's lock: this caller alone is woken
    done: bool = False
    row: Row | None = None
    error: BaseException | None = None


class HeartbeatBatcher:
    """`beat` from any thread: the row `write` returned for this heartbeat's task, or None
    when the attempt did not hold its lease. `write` takes distinct tasks' heartbeats (a
    second heartbeat of a task waits for the next batch: each is fenced by its own lease)."""

    def __init__(
        self,
        write: Callable[[list[HeartbeatParams]], dict[UUID, Row]],
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._write = write
        self._max = max_batch
        self._lock = threading.Lock()
        self._pending: list[_Beat] = []
        self._leading = False

    def beat(self, params: HeartbeatParams) -> Row | None:
        me = _Beat(params, threading.Condition(self._lock))
        with self._lock:
            self._pending.append(me)
            while not me.done:
                if self._leading:
                    me.woken.wait()
                    continue
                # This caller leads; its own heartbeat may be left for the next batch (over
                # `max_batch` older ones, or its task already in this one): it goes round again.
                self._leading = True
                batch: list[_Beat] = []
                try:
                    batch = self._take()
                    self._lock.release()  # written without the lock: others queue meanwhile
                    try:
                        self._write_into(batch)
                    finally:
                        self._lock.acquire()
                except BaseException:  # failed before its write: its own beat is not left queued
                    if me in self._pending:
                        self._pending.remove(me)
                    raise
                finally:  # whatever happened, the batch is answered and another may lead
                    for b in batch:
                        b.done = True
                        b.woken.notify()
                    self._leading = False
                    if self._pending:
                        self._pending[0].woken.notify()
        if me.error is not None:
            # Each caller raises its own copy: one exception object raised in several threads
            # at once would gather all their tracebacks.
            own = _own(me.error)
            if own is me.error:
                raise own
            raise own from me.error
        return me.row

    def _take(self) -> list[_Beat]:
        """The next batch off the pending ones (under the lock): the oldest first, each task
        once, at most MAX_BATCH; the rest stay for the next leader."""
        batch: list[_Beat] = []
        seen: set[UUID] = set()
        rest: list[_Beat] = []
        for b in self._pending:
            if len(batch) < self._max and b.params.task_id not in seen:
                seen.add(b.params.task_id)
                batch.append(b)
            else:
                rest.append(b)
        self._pending = rest
        return batch

    def _write_into(self, batch: list[_Beat]) -> None:
        try:
            rows = self._write([b.params for b in batch])
        except BaseException as e:  # every heartbeat of the batch fails as one alone would
            for b in batch:
                b.error = e
        else:
            for b in batch:
                b.row = rows.get(b.params.task_id)


def _own(error: BaseException) -> BaseException:
    """A copy of `error` for one caller (same type and arguments); the error itself when it
    cannot be rebuilt from its arguments (a constructor with another signature)."""
    try:
        return copy.copy(error)
    except Exception:
        return error
