"""Routing against a real Postgres (issue 40): the alerts a batch added to the org's
`alert_events` start the routing job; `alert_route` (trusted, on the data login) writes one
`alert_deliveries` row per (alert, destination) with a deterministic idempotency key, old
alerts recorded as suppressed; the sink's landing of that batch makes each delivery once, with
its outbox wake-up in the same transaction, and only for the pending ones."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from tests.support.dags import admin
from trace_platform.alerts.routing import idempotency_key
from trace_platform.contract import BufferPublishRequest, Claim, ClaimRequest
from trace_platform.layout import buffer_prefix
from trace_platform.objectstore import make_store
from trace_platform.operators.alert_route import alert_route
from trace_platform.operators.context import OperatorContext, PermanentError
from trace_platform.services import Services
from trace_platform.sink.service import Sink

DAG = """
name: watch
jobs:
  rules:
    operator: alert_evaluate
    config: {rules: [{name: big, sql: "SELECT 1 AS event_time, 'info' AS severity, 'k' AS dedupe_key"}]}
  route:
    operator: alert_route
    inputs: [{from: {dataset: alert_events}}]
    config:
      routes:
        - {destination: ops, min_severity: warning}
        - {destination: audit, rules: [big]}
      max_delivery_age: 3600
"""


def _claim(s: Services, task_id: Any) -> Claim:
    return s.dispatcher.claim(ClaimRequest(task_id=UUID(str(task_id)), worker_id="w"), payload=True)


def _publish(s: Services, c: Claim, dataset: str, key: str) -> None:
    s.dispatcher.buffers.publish(
        BufferPublishRequest(
            task_id=c.task_id,
            attempt=c.attempt,
            lease_token=c.lease_token,
            dataset=dataset,
            location=key,
        )
    )


def _drain(s: Services) -> None:
    store = make_store(s.settings)
    store.ensure_bucket()
    for _ in range(2):
        s.publisher.drain()
        Sink(s.dispatcher, s.driver, store, s.data_dsn).drain()


def _alerts(s: Services, rows: list[dict[str, Any]]) -> None:
    """The rules job's batch of alerts, published as its wrapper would, and landed."""
    me = admin(s)
    (task_id,) = s.control.trigger(me, "watch")["tasks"]
    c = _claim(s, task_id)
    key = f"{buffer_prefix(me.org_id, c.task_id, c.attempt)}alerts.jsonl"
    store = make_store(s.settings)
    store.ensure_bucket()
    store.put(key, "".join(json.dumps(r) + "\n" for r in rows).encode())
    _publish(s, c, "alert_events", key)
    _drain(s)


def _route_tasks(s: Services) -> list[UUID]:
    with s.pool.connection() as conn:
        rows = conn.execute(
            "SELECT r.task_id FROM task_registry r JOIN task_status t USING (task_id)"
            " WHERE r.job = 'route' AND t.status = 'queued'"
        ).fetchall()
    return [r["task_id"] for r in rows]


def _route(s: Services, tmp: Path, task_id: UUID, c: Claim | None = None) -> Claim:
    """The routing task run in-process as its trusted host runs it (the data login in its
    env), and its batch published as its wrapper would. Given its claim again: run once more
    with no batch event (as a manual run: every alert routed again)."""
    again = c is not None
    c = c or _claim(s, task_id)
    assert c.task is not None
    store = make_store(s.settings)
    sent: list[dict[str, Any]] = []
    ctx = OperatorContext(
        task=c.task.model_copy(update={"input_event": None}) if again else c.task,
        workdir=tmp,
        _send=sent.append,
        _store=store,
        env={"TRACE_SINK_DSN": s.data_dsn},
        _batches=10 if again else 0,
    )
    alert_route(ctx)
    for m in sent:
        if m["type"] == "buffer":
            _publish(s, c, m["buffer"]["dataset"], m["buffer"]["location"])
    _drain(s)
    return c


def _alert(key: str, severity: str, age: timedelta, rule: str = "big") -> dict[str, Any]:
    when = datetime.now(UTC) - age
    return {
        "dag_id": "d",
        "job": "rules",
        "rule": rule,
        "dedupe_key": key,
        "severity": severity,
        "event_time": when.isoformat(),
        "payload": {"value": "123456789012345678901234567890"},
    }


def _deliveries(s: Services) -> dict[tuple[str, str], dict[str, Any]]:
    with s.pool.connection() as conn:
        rows = conn.execute("SELECT * FROM deliveries").fetchall()
    return {(r["destination"], json.loads(r["body"])["dedupe_key"]): r for r in rows}


def _wakeups(s: Services) -> list[dict[str, Any]]:
    with s.pool.connection() as conn:
        return [
            r["payload"]
            for r in conn.execute(
                "SELECT payload FROM outbox WHERE queue_name = 'delivery'"
            ).fetchall()
        ]


def test_alerts_are_routed_into_deliveries_once_each_old_ones_suppressed(
    services: Services, tmp_path: Path
) -> None:
    s, me = services, admin(services)
    s.control.deploy(me, DAG)
    _alerts(
        s,
        [
            _alert("warn", "warning", timedelta(minutes=5)),
            _alert("old", "critical", timedelta(days=2)),
            _alert("note", "info", timedelta(minutes=1), rule="small"),  # no route takes it
        ],
    )
    (task,) = _route_tasks(s)  # the landed batch started the routing job
    c = _route(s, tmp_path / "a", task)
    got = _deliveries(s)
    assert sorted(got) == [("audit", "old"), ("audit", "warn"), ("ops", "old"), ("ops", "warn")]
    assert {k: r["status"] for k, r in got.items()} == {
        ("audit", "old"): "suppressed",
        ("ops", "old"): "suppressed",
        ("audit", "warn"): "pending",
        ("ops", "warn"): "pending",
    }
    assert "max_delivery_age is 3600 s" in got[("ops", "old")]["reason"]
    warn = got[("ops", "warn")]
    alert = {"dag_id": "d", "job": "rules", "rule": "big", "dedupe_key": "warn"}
    assert warn["idempotency_key"] == idempotency_key(me.org_id, alert, "ops")
    body = json.loads(warn["body"])
    assert body["payload"] == {"value": "123456789012345678901234567890"}
    assert body["idempotency_key"] == warn["idempotency_key"]
    # Only the pending ones wake a Delivery Service.
    woken = sorted(str(w["delivery_id"]) for w in _wakeups(s))
    pending = sorted(str(r["delivery_id"]) for r in got.values() if r["status"] == "pending")
    assert woken == pending and all(set(w) == {"kind", "delivery_id"} for w in _wakeups(s))
    # Every alert routed again: nothing new, each key keeps its body, no new wake-up.
    _route(s, tmp_path / "b", task, c)
    assert _deliveries(s) == got
    assert len(_wakeups(s)) == 2


def test_alert_route_refuses_to_run_without_the_data_login(
    services: Services, tmp_path: Path
) -> None:
    s = services
    s.control.deploy(admin(s), DAG)
    _alerts(s, [_alert("warn", "warning", timedelta(minutes=5))])
    (task,) = _route_tasks(s)
    c = _claim(s, task)
    assert c.task is not None
    ctx = OperatorContext(task=c.task, workdir=tmp_path, _send=lambda _m: None)
    with pytest.raises(PermanentError, match="trusted platform operator"):
        alert_route(ctx)


def test_a_repeated_alert_routes_nothing_new(services: Services, tmp_path: Path) -> None:
    """A second batch repeating a stored alert adds no alert row, so its routing run routes
    nothing: the delivery, its body and the alert_deliveries rows stay as they were."""
    s, me = services, admin(services)
    s.control.deploy(me, DAG)
    _alerts(s, [_alert("warn", "warning", timedelta(minutes=5))])
    (task,) = _route_tasks(s)
    _route(s, tmp_path / "a", task)
    first = _deliveries(s)
    _alerts(s, [_alert("warn", "warning", timedelta(minutes=1))])  # same key, other time
    for t in _route_tasks(s):
        _route(s, tmp_path / str(t), t)
    assert _deliveries(s) == first
    with s.pool.connection() as conn:
        table = conn.execute(
            "SELECT table_name FROM buffered_datasets WHERE platform = 'alert_deliveries'"
        ).fetchone()["table_name"]
        schema, _, name = table.partition(".")
        n = conn.execute(
            psycopg.sql.SQL("SELECT count(*) AS n FROM {}").format(
                psycopg.sql.Identifier(schema, name)
            )
        ).fetchone()["n"]
    assert n == 2  # ops and audit, once each
