"""HeartbeatBatcher: heartbeats arriving while one is written go together in the next write,
each task once a batch, each caller answered with its own task's row (or the write's error)."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

import pytest

from trace_platform.dispatcher.beats import HeartbeatBatcher
from trace_platform.store.tasks.params import HeartbeatParams


def _beat(task_id: UUID | None = None) -> HeartbeatParams:
    return HeartbeatParams(task_id or uuid.uuid4(), 1, uuid.uuid4(), 60.0, None)


class Writes:
    """The write: records each batch and its thread; the first one waits for `release`."""

    def __init__(self, refused: set[UUID] | None = None) -> None:
        self.batches: list[list[HeartbeatParams]] = []
        self.threads: list[str] = []
        self.release = threading.Event()
        self.first_started = threading.Event()
        self.refused = refused or set()

    def __call__(self, beats: list[HeartbeatParams]) -> dict[UUID, dict[str, Any]]:
        self.batches.append(list(beats))
        self.threads.append(threading.current_thread().name)
        if len(self.batches) == 1:
            self.first_started.set()
            assert self.release.wait(10)
        return {b.task_id: {"lease": b.lease_token} for b in beats if b.task_id not in self.refused}


def _queued(batcher: HeartbeatBatcher, n: int) -> None:
    """Waits until `n` heartbeats wait behind the batch being written."""
    deadline = time.monotonic() + 10
    while len(batcher._pending) < n:
        assert time.monotonic() < deadline, "the heartbeats did not queue"
        time.sleep(0.001)


def test_a_lone_heartbeat_is_written_at_once_by_its_caller() -> None:
    writes = Writes()
    writes.release.set()
    b = _beat()
    assert HeartbeatBatcher(writes).beat(b) == {"lease": b.lease_token}
    assert writes.batches == [[b]] and writes.threads == [threading.current_thread().name]


def test_heartbeats_arriving_meanwhile_go_in_one_write_each_answered_its_own() -> None:
    refused = _beat()
    writes = Writes(refused={refused.task_id})
    batcher = HeartbeatBatcher(writes)
    first = _beat()
    others = [_beat() for _ in range(20)] + [refused]
    with ThreadPoolExecutor(len(others) + 1) as pool:
        lead = pool.submit(batcher.beat, first)
        assert writes.first_started.wait(10)
        futures = [pool.submit(batcher.beat, b) for b in others]
        _queued(batcher, len(others))
        arrived = [b.params for b in batcher._pending]
        writes.release.set()
        assert lead.result(10) == {"lease": first.lease_token}
        got = [f.result(10) for f in futures]
    assert len(writes.batches) == 2 and writes.batches[1] == arrived  # together, in order
    assert got == [{"lease": b.lease_token} for b in others[:-1]] + [None]


def test_a_task_beating_twice_at_once_is_written_in_two_batches() -> None:
    writes = Writes()
    batcher = HeartbeatBatcher(writes)
    task = uuid.uuid4()
    twice = [_beat(task), _beat(task)]
    with ThreadPoolExecutor(3) as pool:
        pool.submit(batcher.beat, _beat())
        assert writes.first_started.wait(10)
        futures = [pool.submit(batcher.beat, b) for b in twice]
        _queued(batcher, 2)
        writes.release.set()
        got = [f.result(10) for f in futures]
    assert [len(b) for b in writes.batches] == [1, 1, 1]
    assert got == [{"lease": b.lease_token} for b in twice]  # each fenced by its own lease


def test_a_batch_is_bounded_and_the_rest_wait_for_the_next() -> None:
    writes = Writes()
    batcher = HeartbeatBatcher(writes, max_batch=5)
    queued = [_beat() for _ in range(12)]
    with ThreadPoolExecutor(len(queued) + 1) as pool:
        pool.submit(batcher.beat, _beat())
        assert writes.first_started.wait(10)
        futures = [pool.submit(batcher.beat, b) for b in queued]
        _queued(batcher, len(queued))
        arrived = [b.params for b in batcher._pending]
        writes.release.set()
        assert [f.result(10) for f in futures] == [{"lease": b.lease_token} for b in queued]
    assert [len(b) for b in writes.batches] == [1, 5, 5, 2]
    assert [b for batch in writes.batches[1:] for b in batch] == arrived  # oldest first


def test_a_failed_write_fails_every_heartbeat_of_its_batch_and_the_next_one_leads() -> None:
    calls: list[int] = []

    def write(beats: list[HeartbeatParams]) -> dict[UUID, dict[str, Any]]:
        calls.append(len(beats))
        if len(calls) == 1:
            raise ConnectionError("the database went away")
        return {b.task_id: {} for b in beats}

    batcher = HeartbeatBatcher(write)
    with pytest.raises(ConnectionError, match="went away"):
        batcher.beat(_beat())
    assert batcher.beat(_beat()) == {}  # not left leading: the next caller writes
    assert calls == [1, 1]


def test_each_caller_of_a_failed_batch_raises_its_own_error() -> None:
    """One exception object raised in several threads at once gathers all their tracebacks:
    each caller gets its own copy, of the write's type, caused by the write's error."""
    writes = Writes()
    failure = ConnectionError("the database went away")

    def write(beats: list[HeartbeatParams]) -> dict[UUID, dict[str, Any]]:
        writes(beats)
        raise failure

    batcher = HeartbeatBatcher(write)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(batcher.beat, _beat())
        assert writes.first_started.wait(10)
        rest = [pool.submit(batcher.beat, _beat()) for _ in range(3)]
        deadline = time.monotonic() + 10
        while len(batcher._pending) < 3 and time.monotonic() < deadline:  # queued meanwhile
            time.sleep(0.001)
        writes.release.set()
        errors = [f.exception(10) for f in [first, *rest]]
    assert all(isinstance(e, ConnectionError) and e.__cause__ is failure for e in errors)
    assert len({id(e) for e in errors}) == 4 and failure not in errors


def test_a_leader_failing_before_its_write_leaves_the_batcher_to_the_next() -> None:
    batcher = HeartbeatBatcher(lambda beats: {b.task_id: {} for b in beats})
    take = batcher._take

    def broken() -> list[Any]:
        batcher._take = take  # type: ignore[method-assign]
        raise MemoryError("while taking the batch")

    batcher._take = broken  # type: ignore[method-assign]
    with pytest.raises(MemoryError):
        batcher.beat(_beat())
    done = threading.Event()
    threading.Thread(target=lambda: (batcher.beat(_beat()), done.set()), daemon=True).start()
    assert done.wait(10), "the batcher was left led by nobody"
    assert batcher._pending == []


def test_an_error_that_cannot_be_copied_is_raised_as_it_is() -> None:
    class Refusal(Exception):
        def __init__(self, code: str, message: str) -> None:
            super().__init__(message)  # args lose `code`: a copy's constructor would fail
            self.code = code

    refusal = Refusal("busy", "the store refused")

    def write(beats: list[HeartbeatParams]) -> dict[UUID, dict[str, Any]]:
        raise refusal

    with pytest.raises(Refusal) as raised:
        HeartbeatBatcher(write).beat(_beat())
    assert raised.value is refusal and raised.value.code == "busy"
