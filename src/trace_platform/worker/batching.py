"""Group commit for a worker's calls: the wrapper threads of one worker each ask for one thing
(claim this wake-up, complete this attempt, ack this message); what they ask while a batch is
in flight goes out together in the next one. No call waits for company: a lone caller's batch
leaves at once, so one wrapper pays nothing and eight share one request and one commit."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741 (an item, as in the typing docs)
R = TypeVar("R")


class _Slot(Generic[I, R]):
    __slots__ = ("done", "error", "item", "result")

    def __init__(self, item: I) -> None:
        self.item = item
        self.done = False
        self.result: R | None = None
        self.error: BaseException | None = None


class Batcher(Generic[I, R]):
    """`submit(item)` from any thread returns `run(batch)`'s answer for that item. `run` gets
    at most `limit` items and answers each, in order, with its result or an exception (raised
    to that item's caller only); an exception out of `run` itself is every caller's. The
    caller whose item finds no batch in flight runs the next one itself (no extra thread)."""

    def __init__(self, run: Callable[[list[I]], list[R | BaseException]], limit: int) -> None:
        self.run = run
        self.limit = max(1, limit)
        self._cond = threading.Condition()
        self._pending: list[_Slot[I, R]] = []
        self._busy = False

    def submit(self, item: I) -> R:
        slot: _Slot[I, R] = _Slot(item)
        with self._cond:
            self._pending.append(slot)
        while True:
            with self._cond:
                while not slot.done and self._busy:
                    self._cond.wait()
                if slot.done:
                    break
                # No batch in flight: this caller runs the next one (its own item may wait for
                # a later one when more than `limit` queued before it).
                self._busy = True
                batch, self._pending = self._pending[: self.limit], self._pending[self.limit :]
            try:
                self._run(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _run(self, batch: list[_Slot[I, R]]) -> None:
        try:
            answers = self.run([s.item for s in batch])
            if len(answers) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} got {len(answers)} answers")
        except BaseException as e:  # the request failed: every caller in it learns so
            answers = [e] * len(batch)
        for s, answer in zip(batch, answers, strict=True):
            if isinstance(answer, BaseException):
                s.error = answer
            else:
                s.result = answer
            s.done = True
