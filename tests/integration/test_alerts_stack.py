"""Alerts end to end on a Lite stack (issue 40): a rule job runs alert_evaluate in a real
worker's sandboxed host (Spark), the wrapper publishes its alerts, a real `trace sink` lands
them in alert_events, whose event runs alert_route in the trusted host, whose work items the
sink lands in alert_deliveries, making deliveries that a real `trace delivery` process sends,
signed, to a receiver on 127.0.0.1 that verifies them with `standardwebhooks`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.dags import admin
from tests.support.receiver import Receiver
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.db.embedded import free_port
from trace_platform.delivery.control import DeliveryControl
from trace_platform.identity.vault import vault_for
from trace_platform.lite.stack import LiteStack

RULE = (
    "SELECT 1700000000 + n AS event_time,"
    " CASE WHEN n > 1 THEN 'critical' ELSE 'warning' END AS severity,"
    " concat('transfer-', n) AS dedupe_key, named_struct('n', n) AS payload"
    " FROM VALUES (1), (2), (3) AS t(n)"
)
DAG = f"""
name: alarms
jobs:
  rules:
    operator: alert_evaluate
    config: {{rules: [{{name: big, sql: "{RULE}"}}]}}
  route:
    operator: alert_route
    inputs: [{{from: {{dataset: alert_events}}}}]
    config:
      routes: [{{destination: hook, min_severity: critical}}]
      max_delivery_age: 315360000
"""


@pytest.fixture
def stack(settings: Settings, dsn: str) -> Iterator[LiteStack]:
    roomy = settings.model_copy(update={"lease_seconds": 30.0, "heartbeat_seconds": 1.0})
    env = {
        "TRACE_QUEUE_POLL_SECONDS": "0.2",
        "TRACE_DELIVERY_POLL_SECONDS": "0.1",
        "TRACE_DELIVERY_BACKOFF_SECONDS": "0.1",
    }
    s = LiteStack(roomy, workers=1, sinks=1, deliverers=1, dsn=dsn, worker_env=env)
    s.start()
    yield s
    s.stop()


def test_an_alert_rule_ends_as_signed_webhooks_at_a_receiver(stack: LiteStack) -> None:
    svc = stack.services
    me = admin(svc)
    recv = Receiver(free_port(), None)
    ctl = DeliveryControl(svc.pool, vault_for(svc.settings))
    recv.secret = ctl.add_destination(me, "hook", recv.url, allow_private=True)
    recv.start()
    try:
        svc.control.deploy(me, DAG)
        svc.control.trigger(me, "alarms")
        got = recv.wait(lambda a: len({x.webhook_id for x in a if x.verified}) == 2, 150)
    finally:
        recv.stop()
    assert all(a.verified for a in got)
    keys = sorted({a.body for a in got})
    assert len(keys) == 2 and all('"severity":"critical"' in b for b in keys)

    def delivered() -> list[dict[str, object]] | None:
        rows = ctl.list_deliveries(me)
        return rows if [r["status"] for r in rows] == ["delivered"] * 2 else None

    wait_for(delivered, 20, "both deliveries settled as delivered")
    alerts = svc.query.query(me, "SELECT dedupe_key FROM alert_events ORDER BY 1").as_json()
    assert alerts["rows"] == [["transfer-1"], ["transfer-2"], ["transfer-3"]]  # all recorded
