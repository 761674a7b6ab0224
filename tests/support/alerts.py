"""Alerts for tests: a batch of alerts published as an alert_evaluate job's wrapper would and
landed by a real sink, a routing task run in-process as its trusted host runs it, and the
deliveries that come of them."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

from psycopg import Connection

from tests.support.buffers import batch_key, object_store, publish, sink, write_lines
from tests.support.dags import admin
from trace_platform.contract import Claim, ClaimRequest
from trace_platform.operators.alert_route import alert_route
from trace_platform.operators.context import OperatorContext
from trace_platform.services import Services
from trace_platform.store.deliveries import DeliveryStore


def dag(name: str = "watch", destinations: tuple[str, ...] = ("ops",), age: int = 3600) -> str:
    routes = ", ".join(f"{{destination: {d}}}" for d in destinations)
    rule = "SELECT 1 AS event_time, 'info' AS severity, 'k' AS dedupe_key"
    return f"""
name: {name}
jobs:
  rules:
    operator: alert_evaluate
    config: {{rules: [{{name: big, sql: "{rule}"}}]}}
  route:
    operator: alert_route
    inputs: [{{from: {{dataset: alert_events}}}}]
    config: {{routes: [{routes}], max_delivery_age: {age}}}
"""


def claim(s: Services, task_id: Any) -> Claim:
    return s.dispatcher.claim(ClaimRequest(task_id=UUID(str(task_id)), worker_id="w"), payload=True)


def drain(s: Services) -> None:
    for _ in range(2):
        sink(s).drain()


def alert(key: str, severity: str, age: timedelta, rule: str = "big") -> dict[str, Any]:
    """An alert row as a rules job writes it. Its dag_id "d" is a claim the sink replaces
    with the publishing task's DAG (as it does its job and org)."""
    when = datetime.now(UTC) - age
    return {
        "dag_id": "d",
        "job": "rules",
        "rule": rule,
        "dedupe_key": key,
        "severity": severity,
        "event_time": when.isoformat(),
        "payload": {"value": "123456789012345678901234567890", "key": key},
    }


def dag_ids(s: Services) -> dict[str, str]:
    """DAG name -> its dag_id as alert rows carry it (text)."""
    with s.pool.connection() as conn:
        rows = conn.execute("SELECT name, dag_id FROM dags").fetchall()
    return {r["name"]: str(r["dag_id"]) for r in rows}


def publish_alerts(s: Services, rows: list[dict[str, Any]], dag_name: str = "watch") -> None:
    """The rules job's batch of alerts, published as its wrapper would, and landed."""
    me = admin(s)
    (task_id,) = s.control.trigger(me, dag_name)["tasks"]
    c = claim(s, task_id)
    key = write_lines(s, batch_key(s, c, me.org_id, "alerts.jsonl"), rows)
    publish(s, c, "alert_events", key)
    drain(s)


def route_tasks(s: Services, status: str = "queued") -> list[UUID]:
    with s.pool.connection() as conn:
        rows = conn.execute(
            "SELECT r.task_id FROM task_registry r JOIN task_status t USING (task_id)"
            " WHERE r.job = 'route' AND t.status = %s",
            (status,),
        ).fetchall()
    return [r["task_id"] for r in rows]


def route(s: Services, tmp: Path, task_id: UUID, c: Claim | None = None) -> Claim:
    """The routing task run in-process as its trusted host runs it (the data login in its
    env), and its batch published as its wrapper would. Given its claim again: run once more
    with no batch event (as a manual run: every alert routed again)."""
    again = c is not None
    c = c or claim(s, task_id)
    assert c.task is not None
    sent: list[dict[str, Any]] = []
    ctx = OperatorContext(
        task=c.task.model_copy(update={"input_event": None}) if again else c.task,
        workdir=tmp,
        _send=sent.append,
        _store=object_store(s),
        env={"TRACE_SINK_DSN": s.data_dsn},
        _batches=10 if again else 0,
    )
    alert_route(ctx)
    for m in sent:
        if m["type"] == "buffer":
            publish(s, c, m["buffer"]["dataset"], m["buffer"]["location"])
    drain(s)
    return c


def deliveries(s: Services) -> dict[tuple[str, str], dict[str, Any]]:
    """(destination, the alert's dedupe_key) -> its delivery row."""
    with s.pool.connection() as conn:
        rows = conn.execute("SELECT * FROM deliveries").fetchall()
    return {(r["destination"], json.loads(r["body"])["dedupe_key"]): r for r in rows}


def add_delivery(
    conn: Connection[Any],
    org_id: UUID,
    *,
    key: str = "k",
    status: str = "pending",
    reason: str | None = None,
    rule: str = "r",
    severity: str = "info",
    body: str = "{}",
) -> UUID:
    """A delivery row of the org's destination "ops", made directly (not routed): for what
    reads or leases deliveries. Returns its delivery_id."""
    delivery_id = uuid.uuid4()
    DeliveryStore(conn).insert_delivery(
        delivery_id=delivery_id,
        org_id=org_id,
        idempotency_key=key,
        destination="ops",
        record_id=uuid.uuid4(),
        rule=rule,
        severity=severity,
        event_time=datetime.now(UTC),
        body=body,
        status=status,
        reason=reason,
    )
    return delivery_id
