"""A worker's acks ride on its next queue receive (`worker.wrapper.HeldAcks`): one statement
and one commit for both. Each is held only after its completion committed; what no receive
takes within the linger goes out alone; a failed receive keeps them; exit flushes them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.queue_conformance import wake
from trace_platform.queue.pgqueue import PgQueue
from trace_platform.worker.held_acks import HeldAcks

Q = "tasks"


class Counting:
    """The real driver, with its calls counted by name."""

    def __init__(self, driver: PgQueue) -> None:
        self.driver = driver
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.driver, name)
        if callable(attr):

            def counted(*a: Any, **kw: Any) -> Any:
                self.calls.append(name)
                return attr(*a, **kw)

            return counted
        return attr


@pytest.fixture
def driver(dsn: str) -> Iterator[Counting]:
    drv = PgQueue.from_dsn(dsn, poll_seconds=0.2)
    yield Counting(drv)
    drv.close()


def left(driver: Counting) -> int:
    with driver.driver.pool.connection() as conn:
        row = conn.execute("SELECT count(*) AS n FROM queue_messages").fetchone()
    assert row is not None
    return int(row["n"])


def test_the_next_receive_carries_the_held_acks(driver: Counting) -> None:
    acks = HeldAcks(driver, Q, linger=60)  # type: ignore[arg-type]  # never alone, here
    for _ in range(3):
        driver.publish(Q, wake())
    (first,) = acks.receive(1, 30, 0)
    assert left(driver) == 3
    acks.submit(first.receipt)
    assert left(driver) == 3  # held, not yet sent
    (second,) = acks.receive(1, 30, 0)
    assert second.receipt != first.receipt
    assert left(driver) == 2  # the first is gone, in the second's statement
    assert "ack_many" not in driver.calls and "ack" not in driver.calls


def test_what_no_receive_takes_goes_out_alone_after_the_linger(driver: Counting) -> None:
    acks = HeldAcks(driver, Q, linger=0.2)
    driver.publish(Q, wake())
    (msg,) = driver.receive(Q, 1, 30)
    acks.submit(msg.receipt)
    deadline = time.monotonic() + 5
    while left(driver) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left(driver) == 0 and driver.calls.count("ack_many") == 1


def test_a_failed_receive_keeps_its_acks_and_flush_sends_them(driver: Counting) -> None:
    acks = HeldAcks(driver, Q, linger=60)
    driver.publish(Q, wake())
    (msg,) = driver.receive(Q, 1, 30)
    acks.submit(msg.receipt)

    def refuse(*a: Any, **kw: Any) -> Any:
        raise ConnectionError("the database went away")

    driver.driver.receive = refuse  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        acks.receive(1, 30, 0)
    assert left(driver) == 1
    acks.flush()  # as a wrapper's run does on exit
    assert left(driver) == 0
    acks.flush()  # nothing held: nothing sent
    assert driver.calls.count("ack_many") == 1


def test_a_held_ack_whose_lease_ran_out_spares_the_next_lease(driver: Counting) -> None:
    """Held past its lease (the message redelivered to another wrapper), a receipt carried by a
    receive deletes nothing: the new lease's holder still owns, and acks, the message."""
    acks = HeldAcks(driver, Q, linger=60)  # type: ignore[arg-type]
    driver.publish(Q, wake())
    (old,) = driver.receive(Q, 1, 0.2)
    acks.submit(old.receipt)
    time.sleep(0.4)  # the lease runs out while the ack is held
    (new,) = driver.receive(Q, 1, 30)
    assert new.receipt != old.receipt
    assert acks.receive(1, 30, 0) == []  # carries the stale receipt: nothing ready, nothing gone
    assert left(driver) == 1
    assert driver.ack(Q, new.receipt) and left(driver) == 0


def test_the_linger_thread_ends_when_nothing_is_held(driver: Counting) -> None:
    acks = HeldAcks(driver, Q, linger=0.1)
    driver.publish(Q, wake())
    (msg,) = driver.receive(Q, 1, 30)
    acks.submit(msg.receipt)
    thread = acks._thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive() and acks._thread is None and left(driver) == 0
    driver.publish(Q, wake())  # and the next held ack starts another
    (msg,) = driver.receive(Q, 1, 30)
    acks.submit(msg.receipt)
    assert acks._thread is not None and acks._thread is not thread
    acks.flush()


def test_a_malformed_receipt_is_dropped_not_held_forever(driver: Counting) -> None:
    acks = HeldAcks(driver, Q, linger=60)  # type: ignore[arg-type]
    driver.publish(Q, wake())
    acks.submit("not a receipt")
    with pytest.raises(ValueError):
        acks.receive(1, 30, 0)
    assert left(driver) == 1  # nothing leased by the refused statement
    assert len(acks.receive(1, 30, 0)) == 1  # the next receive is not poisoned
    acks.submit("not a receipt either")
    with pytest.raises(ValueError):
        acks.flush()  # nor is the flush: dropped there too
    assert acks.take() == []
