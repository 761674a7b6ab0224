"""The worker's group commit (`worker/batching.py`): concurrent callers share batches, each
gets its own item's answer, a failed batch fails every caller in it, and a lone caller's
batch leaves at once."""

from __future__ import annotations

import threading
import time

import pytest

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
