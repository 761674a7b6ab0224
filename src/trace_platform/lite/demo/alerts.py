"""The demo's alerts: a local receiver (lite/demo/receiver.py) the demo DAG's routes deliver
to (destination `demo_receiver`, on loopback, so allowed explicitly), and the end's count:
"N alerts, N deliveries, N received and verified"."""

from __future__ import annotations

import time

from rich.console import Console

from trace_platform.delivery.control import DeliveryControl
from trace_platform.errors import Conflict, NotFound
from trace_platform.identity import Actor
from trace_platform.identity.vault import vault_for
from trace_platform.lite.demo.receiver import DemoReceiver
from trace_platform.services import Services

DESTINATION = "demo_receiver"


def _control(svc: Services) -> DeliveryControl:
    return DeliveryControl(svc.pool, vault_for(svc.settings))


def start_receiver(svc: Services, me: Actor) -> DemoReceiver:
    """The receiver, listening, and the demo's destination pointing at it with a secret only
    it holds (a new one each run)."""
    recv = DemoReceiver().start()
    ctl = _control(svc)
    try:
        recv.secret = ctl.add_destination(me, DESTINATION, recv.url, allow_private=True)
    except Conflict:  # a run before made it: this run's address and a fresh secret
        recv.secret = ctl.set_destination(
            me, DESTINATION, url=recv.url, enabled=True, allow_private=True, rotate_secret=True
        )
    return recv


def alerts_recorded(svc: Services, me: Actor) -> int:
    try:
        rows = svc.query.query(me, "SELECT count(*) FROM alert_events").as_json()["rows"]
    except NotFound:  # no alert rule has run in this org yet
        return 0
    return int(rows[0][0])


def settle(
    svc: Services, me: Actor, recv: DemoReceiver, console: Console, timeout: float = 120
) -> tuple[int, dict[str, int], int]:
    """Waits for the alert pipeline to settle (alerts landed and routed, deliveries sent), then
    prints and returns (alerts, deliveries by status, received and verified this run)."""
    ctl = _control(svc)
    deadline = time.monotonic() + timeout
    while ctl.open_work(me) and time.monotonic() < deadline:
        time.sleep(0.5)
    alerts, counts = alerts_recorded(svc, me), ctl.counts(me)
    total = sum(counts.values())
    console.print(
        f"[bold]{alerts} alerts, {total} deliveries, {len(recv.verified)} received and "
        f"verified[/bold] by the demo receiver ({recv.url}) this run — deliveries: "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + (f"; {recv.rejected} rejected (bad signature)" if recv.rejected else "")
    )
    return alerts, counts, len(recv.verified)
