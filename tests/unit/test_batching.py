"""The worker's group commit (`worker/batching.py`): concurrent callers share batches, each
gets its own item's answer, a failed batch fails every caller in it, and a lone caller's
batch leaves at once."""

from __future__ import annotations

import threading
import time

import pytest

from trace_platform.worker import batching
from trace_platform.worker.batching import Batcher


def test_concurrent_callers_share_batches_and_get_their_own_answers() -> None:
    batches: list[list[int]] = []
    gate = threading.Event()

    def run(items: list[int]) -> list[int | BaseException]:
        gate.wait(5)  # the first batch is held in flight while the others queue up
        batches.append(items)
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]

    b: Batcher[int, int] = Batcher(run, limit=4)
    results: dict[int, object] = {}

    def call(i: int) -> None:
        try:
            results[i] = b.submit(i)
        except ValueError as e:
            results[i] = str(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(9)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(5)
    assert results == {i: f"odd {i}" if i % 2 else i * 10 for i in range(9)}
    assert sorted(i for batch in batches for i in batch) == list(range(9))
    assert max(len(batch) for batch in batches) <= 4 and len(batches) < 9


def test_a_failed_batch_fails_each_of_its_callers() -> None:
    def run(items: list[int]) -> list[int | BaseException]:
        raise ConnectionError("api away")

    b: Batcher[int, int] = Batcher(run, limit=10)
    with pytest.raises(ConnectionError):
        b.submit(1)
    # and the next caller runs its own batch (nothing stays in flight)
    with pytest.raises(ConnectionError):
        b.submit(2)


def test_a_lone_caller_does_not_wait_for_company() -> None:
    b: Batcher[int, int] = Batcher(lambda items: [i + 1 for i in items], limit=10)
    t0 = time.monotonic()
    assert [b.submit(i) for i in range(100)] == list(range(1, 101))
    assert time.monotonic() - t0 < 1.0


def test_no_caller_is_left_waiting_under_contention() -> None:
    """Under contention (more callers than a batch holds, batches back to back) every
    caller is answered, with its own answer, and none is left asleep."""
    b: Batcher[tuple[int, int], tuple[int, int]] = Batcher(
        lambda items: [(t, n + 1) for t, n in items], limit=3
    )
    answered = [0] * 16

    def caller(t: int) -> None:
        for n in range(300):
            assert b.submit((t, n)) == (t, n + 1)
            answered[t] += 1

    threads = [threading.Thread(target=caller, args=(t,), daemon=True) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert answered == [300] * 16


def test_each_waiting_caller_is_woken_once() -> None:
    """A caller sleeps until its answer is in or it is handed the next batch, never woken
    to find itself still waiting (one condition notified to all did that at every batch)."""
    wakes: list[int] = []

    class Counted(batching._Slot[int, int]):
        def __init__(self, item: int) -> None:
            super().__init__(item)
            lock = self.wake

            class Wake:
                def acquire(self, blocking: bool = True) -> bool:
                    wakes.append(item)
                    return lock.acquire(blocking)

                def release(self) -> None:
                    lock.release()

            self.wake = Wake()  # type: ignore[assignment]

    gate = threading.Event()

    def run(items: list[int]) -> list[int | BaseException]:
        gate.wait(5)
        return [i + 1 for i in items]

    b: Batcher[int, int] = Batcher(run, limit=2)
    results: dict[int, int] = {}
    original, batching._Slot = batching._Slot, Counted  # type: ignore[misc]
    try:
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, b.submit(i)))
            for i in range(7)
        ]
        for t in threads:
            t.start()
            time.sleep(0.02)  # in order: 0 runs the first batch, the others queue behind it
        gate.set()
        for t in threads:
            t.join(5)
    finally:
        batching._Slot = original  # type: ignore[misc]
    assert results == {i: i + 1 for i in range(7)}
    assert sorted(wakes) == list(range(1, 7))  # each waiter slept once; the first never


def test_a_caller_interrupted_while_waiting_leaves_the_rest_served() -> None:
    """A waiting caller that a signal interrupts takes its item out, and if it had just
    been handed the next batch, hands it on: the callers behind it are still answered."""
    gate = threading.Event()
    ran: list[list[int]] = []

    def run(items: list[int]) -> list[int | BaseException]:
        gate.wait(5)
        ran.append(items)
        return [i * 2 for i in items]

    class Interrupted(batching._Slot[int, int]):
        def __init__(self, item: int) -> None:
            super().__init__(item)
            if item == 1:
                lock = self.wake

                class Wake:
                    def acquire(self, blocking: bool = True) -> bool:
                        if blocking:
                            gate.wait(5)  # interrupted as the batch in flight ends
                            time.sleep(0.05)
                            raise KeyboardInterrupt
                        return lock.acquire(False)

                    def release(self) -> None:
                        lock.release()

                self.wake = Wake()  # type: ignore[assignment]

    b: Batcher[int, int] = Batcher(run, limit=1)
    results: dict[int, object] = {}

    def call(i: int) -> None:
        try:
            results[i] = b.submit(i)
        except KeyboardInterrupt:
            results[i] = "interrupted"

    original, batching._Slot = batching._Slot, Interrupted  # type: ignore[misc]
    try:
        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
            time.sleep(0.02)  # 0 runs; 1 is next in line (handed the next batch); then 2
        gate.set()
        for t in threads:
            t.join(5)
    finally:
        batching._Slot = original  # type: ignore[misc]
    assert results == {0: 0, 1: "interrupted", 2: 4}
    assert ran == [[0], [2]]
    assert b.submit(5) == 10  # nothing is left in flight
