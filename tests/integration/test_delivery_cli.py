"""`trace destinations`, `trace delivery --once`, `trace deliveries` and `trace alerts` as a
user runs them (real subprocesses, a real receiver on 127.0.0.1 verifying signatures)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from tests.support.alerts import alert, dag, deliveries, publish_alerts, route, route_tasks
from tests.support.cli import trace
from tests.support.dags import admin
from tests.support.receiver import Receiver
from trace_platform.db.embedded import free_port
from trace_platform.services import Services


def test_destinations_delivery_deliveries_and_alerts_from_the_cli(
    services: Services, dsn: str, tmp_path: Path
) -> None:
    s = services
    env = {
        "TRACE_STATE_DSN": dsn,
        "TRACE_HOME": str(s.settings.home),
        "TRACE_DELIVERY_BACKOFF_SECONDS": "0.05",
    }
    port = free_port()
    added = trace(
        ["destinations", "add", "ops", f"http://127.0.0.1:{port}/hook", "--allow-private"], env
    )
    assert added.returncode == 0, added.stdout + added.stderr
    secret = re.search(r"(whsec_\S+)", added.stdout)
    assert secret, added.stdout
    s.control.deploy(admin(s), dag())
    publish_alerts(s, [alert("a", "warning", timedelta(minutes=1))])
    for t in route_tasks(s):
        route(s, tmp_path / str(t), t)
    recv = Receiver(port, secret.group(1)).start()
    try:
        sent = trace(["delivery", "--once"], env)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        (arrived,) = recv.wait(lambda a: len(a) == 1)
    finally:
        recv.stop()
    assert arrived.verified
    (d,) = deliveries(s).values()
    listed = trace(["deliveries", "list", "--status", "delivered"], env)
    assert str(d["delivery_id"]) in listed.stdout, listed.stdout + listed.stderr
    shown = trace(["deliveries", "show", str(d["delivery_id"])], env)
    assert d["idempotency_key"] in shown.stdout and "delivered" in shown.stdout
    assert "127.0.0.1" in shown.stdout  # the attempt's checked address
    again = trace(["deliveries", "retry", str(d["delivery_id"])], env)
    assert again.returncode == 1 and "is delivered, not failed" in again.stdout
    off = trace(["destinations", "disable", "ops"], env)
    assert off.returncode == 0 and "disabled" in off.stdout
    dests = trace(["destinations", "list"], env)
    assert re.search(r"ops\s.*127\.0\.0\.1.*\bno\b", dests.stdout), dests.stdout
    alerts = trace(["alerts", "list", "--rule", "big"], env)
    assert alerts.returncode == 0 and "warning" in alerts.stdout, alerts.stdout + alerts.stderr
