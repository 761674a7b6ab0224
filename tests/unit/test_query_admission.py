"""Admission to the query workers (query/admission.py) on its own: the order out of the queue,
the caps, and the refusals. Threads stand in for queries; each holds its place until told."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID

import pytest

from trace_platform.identity import Actor
from trace_platform.query.admission import Admission
from trace_platform.query.errors import NotAdmitted, QueueFull, QueueTimeout, TooManyQueries

ORG = uuid.uuid4()


def actor(name: str, org: UUID = ORG) -> Actor:
    return Actor(uuid.uuid4(), org, name, False)


def admission(**caps: float) -> Admission:
    base: dict[str, float] = {
        "workers": 3,
        "per_user": 2,
        "per_org": 10,
        "queue_size": 10,
        "queued_per_user": 10,
        "wait_seconds": 10.0,
    }
    return Admission(**base | caps)  # type: ignore[arg-type]


class Query:
    """A query on a thread of its own: it takes its place, notes the order it got in, and holds
    the place until `end()`."""

    def __init__(self, adm: Admission, who: Actor, order: list[str], label: str) -> None:
        self.error: NotAdmitted | None = None
        self.admitted = threading.Event()
        self._end = threading.Event()

        def run() -> None:
            try:
                with adm.slot(who, hold_seconds=30):
                    order.append(label)
                    self.admitted.set()
                    self._end.wait(10)
            except NotAdmitted as e:
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def end(self) -> None:
        self._end.set()
        self.thread.join(5)
        assert not self.thread.is_alive()


class Queries:
    """The queries a test started, and the order they got in."""

    def __init__(self, adm: Admission) -> None:
        self.adm = adm
        self.order: list[str] = []
        self.made: list[Query] = []

    def start(self, who: Actor, label: str) -> Query:
        q = Query(self.adm, who, self.order, label)
        self.made.append(q)
        return q


@contextmanager
def queries(adm: Admission) -> Iterator[Queries]:
    qs = Queries(adm)
    try:
        yield qs
    finally:
        for q in qs.made:
            q.end()


def settle(adm: Admission, running: int, waiting: int) -> None:
    assert adm.wait_until(lambda: (adm.running(), adm.waiting()) == (running, waiting), 5), (
        adm.running(),
        adm.waiting(),
    )


def test_a_user_with_nothing_running_goes_ahead_of_one_at_their_share() -> None:
    adm = admission()
    a, b, c = actor("a"), actor("b"), actor("c")
    with queries(adm) as qs:
        a1, a2, b1 = qs.start(a, "a1"), qs.start(a, "a2"), qs.start(b, "b1")
        settle(adm, 3, 0)
        b2 = qs.start(b, "b2")
        settle(adm, 3, 1)
        c1 = qs.start(c, "c1")  # arrives after b2, runs nothing yet
        settle(adm, 3, 2)
        a3 = qs.start(a, "a3")  # a is at their share: not before b2 or c1
        settle(adm, 3, 3)
        for ending, next_in in ((a1, c1), (b1, b2), (a2, a3)):
            ending.end()
            assert next_in.admitted.wait(5)
        assert qs.order[3:] == ["c1", "b2", "a3"]


def test_one_org_holds_at_most_its_share_another_org_gets_in_at_once() -> None:
    adm = admission(workers=3, per_user=1, per_org=2)
    with queries(adm) as qs:
        qs.start(actor("a"), "a")
        qs.start(actor("b"), "b")
        settle(adm, 2, 0)
        qs.start(actor("c"), "c")  # same org: waits, a worker is free
        settle(adm, 2, 1)
        x = qs.start(actor("x", uuid.uuid4()), "x")
        assert x.admitted.wait(5)
        assert qs.order[2:] == ["x"] and adm.waiting() == 1


def test_refusals_say_when_to_come_back() -> None:
    adm = admission(workers=1, per_user=1, queue_size=2, queued_per_user=1)
    a, b, c = actor("a"), actor("b"), actor("c")
    with queries(adm) as qs:
        qs.start(a, "a1")
        settle(adm, 1, 0)
        qs.start(a, "a2")
        settle(adm, 1, 1)
        late = qs.start(a, "a3")
        late.thread.join(5)
        assert isinstance(late.error, TooManyQueries)
        assert late.error.message.startswith("'a' already has 1 query running and 1 waiting")
        assert 29 <= late.error.retry_after <= 30  # a1 will have ended by then at the latest
        qs.start(b, "b1")
        settle(adm, 1, 2)
        full = qs.start(c, "c1")
        full.thread.join(5)
        assert isinstance(full.error, QueueFull) and full.error.detail["queue_size"] == 2
        assert full.error.detail["retry_after_seconds"] == full.error.retry_after
        assert len([q for q in qs.made if q.error is None]) == 3


def test_a_wait_past_its_bound_is_refused_and_leaves_the_queue() -> None:
    adm = admission(workers=1, wait_seconds=0.2)
    with queries(adm) as qs:
        qs.start(actor("a"), "a")
        settle(adm, 1, 0)
        with pytest.raises(QueueTimeout) as e, adm.slot(actor("b"), hold_seconds=1):
            pass
        assert "waited 0.2 s for a query worker" in e.value.message
        assert e.value.retry_after >= 1
        assert adm.waiting() == 0
