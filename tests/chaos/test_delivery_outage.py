"""Issue 40's must-hold, at its own scale: a receiver down for 30 s (by the wall clock, from the
first failed attempt) then back. Two Delivery Services keep retrying every delivery through the
whole outage (capped, jittered backoff; an age limit well past the outage), and once the
receiver is back every delivery arrives once, verified by the `standardwebhooks` package, each
idempotency key with the body stored when it was made. ~35 s: slow."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from tests.integration.test_delivery import _attempts, _by_status, _control, _deliver, _service
from tests.support.alerts import alert, dag, deliveries
from tests.support.dags import admin
from tests.support.receiver import Receiver
from tests.support.wait import wait_for
from trace_platform.delivery.service import DeliveryService
from trace_platform.services import Services

pytestmark = pytest.mark.slow

OUTAGE = 30.0  # seconds the receiver is down, from the first failed attempt
SETTINGS = {
    "delivery_backoff_seconds": 0.5,
    "delivery_backoff_max_seconds": 2.0,  # a retry at least every ~2 s through the outage
    "delivery_max_age_seconds": 120.0,  # well past the outage: nothing gives up during it
    "delivery_lease_seconds": 30.0,  # no lease runs out mid-send: each arrives once
}
MAX_GAP = 6.0  # the longest a delivery may go untried while down (2 s cap, load slack)


@pytest.fixture
def port() -> Iterator[tuple[int, socket.socket]]:
    """A port held bound but not listening (connections to it are refused, as to a receiver
    that is down), so no other process takes it during the outage."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    yield holder.getsockname()[1], holder
    holder.close()


def test_a_receiver_down_for_30_s_then_back_gets_every_delivery_each_key_with_one_body(
    services: Services, tmp_path: Path, port: tuple[int, socket.socket]
) -> None:
    s, me = services, admin(services)
    number, holder = port
    s.control.deploy(me, dag())
    secret = _control(s).add_destination(
        me, "ops", f"http://127.0.0.1:{number}/hook", allow_private=True
    )
    fresh = [alert(f"a{i}", "warning", timedelta(minutes=i)) for i in range(6)]
    _deliver(s, tmp_path, [*fresh, alert("stale", "critical", timedelta(days=3))])
    assert _by_status(s) == {"pending": 6, "suppressed": 1}
    keys = {r["delivery_id"] for r in deliveries(s).values() if r["status"] == "pending"}

    stop = threading.Event()
    senders: list[DeliveryService] = [_service(s, **SETTINGS) for _ in range(2)]
    threads = [threading.Thread(target=d.serve, args=(stop,), daemon=True) for d in senders]
    for t in threads:
        t.start()
    recv: Receiver | None = None
    try:
        # Down: wait (on the attempts recorded, not a sleep) until every delivery has been
        # tried again OUTAGE seconds after the first failure.
        first = wait_for(
            lambda: min((a["started_at"] for a in _attempts(s)), default=None),
            20,
            "the first failed attempt",
        )
        wait_for(
            lambda: (
                {
                    a["delivery_id"]
                    for a in _attempts(s)
                    if a["started_at"] >= first + timedelta(seconds=OUTAGE)
                }
                >= keys
            ),
            OUTAGE + 20,
            f"every delivery retried {OUTAGE:g} s after the first failure",
        )
        holder.close()
        back = datetime.now(UTC)
        recv = Receiver(number, secret).start()
        arrivals = recv.wait(lambda got: len({a.webhook_id for a in got if a.verified}) == 6)
        wait_for(lambda: _by_status(s).get("delivered") == 6, 10, "all six delivered")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for d in senders:
            d.close()
        if recv is not None:
            recv.stop()

    assert (back - first).total_seconds() >= OUTAGE  # a real 30 s outage, by the wall clock
    down = [a for a in _attempts(s) if a["started_at"] < back]
    assert all(a["outcome"] == "retry" for a in down)  # none gave up, none got through
    assert all("ConnectError" in a["error"] and a["address"] == "127.0.0.1" for a in down)
    for key in keys:  # each retried throughout the outage, never left untried for long
        times = sorted(a["started_at"] for a in down if a["delivery_id"] == key)
        gaps = [(b - a).total_seconds() for a, b in pairwise(times)]
        assert (times[-1] - first).total_seconds() >= OUTAGE and max(gaps) <= MAX_GAP, gaps

    assert recv is not None
    stored = {r["idempotency_key"]: r["body"] for r in deliveries(s).values()}
    assert all(a.verified for a in arrivals)
    assert sorted(a.webhook_id for a in recv.arrivals) == sorted(
        r["idempotency_key"] for r in deliveries(s).values() if r["status"] == "delivered"
    )  # every delivery arrived, once
    for a in recv.arrivals:  # each key with the body stored when it was made
        assert a.body == stored[a.webhook_id]
    assert deliveries(s)[("ops", "stale")]["status"] == "suppressed"  # recorded, never sent
    assert all(json.loads(a.body)["dedupe_key"] != "stale" for a in recv.arrivals)
