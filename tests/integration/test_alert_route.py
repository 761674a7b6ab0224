"""Routing against a real Postgres (issue 40): the alerts a batch added to the org's
`alert_events` start the routing job; `alert_route` (trusted, on the data login) writes one
`alert_deliveries` row per (alert, destination) with a deterministic idempotency key, old
alerts recorded as suppressed; the sink's landing of that batch makes each delivery once, with
its outbox wake-up in the same transaction, and only for the pending ones."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.alerts import (
    alert,
    claim,
    dag,
    dag_ids,
    deliveries,
    drain,
    publish,
    publish_alerts,
    route,
    route_tasks,
)
from tests.support.dags import admin
from trace_platform.alerts.datasets import ALERT_DELIVERIES, ALERT_EVENTS
from trace_platform.alerts.routing import idempotency_key
from trace_platform.layout import buffer_prefix, buffer_queue
from trace_platform.objectstore import make_store
from trace_platform.operators.alert_route import alert_route
from trace_platform.operators.context import OperatorContext, PermanentError
from trace_platform.services import Services

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
    publish_alerts(
        s,
        [
            alert("warn", "warning", timedelta(minutes=5)),
            alert("old", "critical", timedelta(days=2)),
            alert("note", "info", timedelta(minutes=1), rule="small"),  # no route takes it
        ],
    )
    (task,) = route_tasks(s)  # the landed batch started the routing job
    c = route(s, tmp_path / "a", task)
    got = deliveries(s)
    assert sorted(got) == [("audit", "old"), ("audit", "warn"), ("ops", "old"), ("ops", "warn")]
    assert {k: r["status"] for k, r in got.items()} == {
        ("audit", "old"): "suppressed",
        ("ops", "old"): "suppressed",
        ("audit", "warn"): "pending",
        ("ops", "warn"): "pending",
    }
    assert "max_delivery_age is 3600 s" in got[("ops", "old")]["reason"]
    warn = got[("ops", "warn")]
    # The alert's producer is the publishing job's (its rows said dag_id "d").
    named = {"dag_id": dag_ids(s)["watch"], "job": "rules", "rule": "big", "dedupe_key": "warn"}
    assert warn["idempotency_key"] == idempotency_key(me.org_id, named, "ops")
    body = json.loads(warn["body"])
    assert body["payload"] == {"value": "123456789012345678901234567890", "key": "warn"}
    assert body["idempotency_key"] == warn["idempotency_key"]
    # Only the pending ones wake a Delivery Service.
    woken = sorted(str(w["delivery_id"]) for w in _wakeups(s))
    pending = sorted(str(r["delivery_id"]) for r in got.values() if r["status"] == "pending")
    assert woken == pending and all(set(w) == {"kind", "delivery_id"} for w in _wakeups(s))
    # Every alert routed again: nothing new, each key keeps its body, no new wake-up.
    route(s, tmp_path / "b", task, c)
    assert deliveries(s) == got
    assert len(_wakeups(s)) == 2


def test_the_orgs_alert_datasets_are_made_as_any_buffered_dataset(services: Services) -> None:
    """alert_events and alert_deliveries come out of the one maker of buffered datasets
    (registry.buffered.create), as a DAG-declared one does: a Postgres dataset row named for
    good, one complete version that is current, the platform's columns and key, and a queue of
    its own."""
    s, me = services, admin(services)
    s.control.deploy(
        me,
        "name: own\njobs:\n  w: {operator: noop, buffer_outputs: [mine]}\n"
        "buffered:\n  - {name: mine, columns: [{name: k, type: text}], unique_key: [k],"
        " writers: [own.w]}\n",
    )
    s.control.deploy(me, DAG)
    with s.pool.connection() as conn:
        rows = conn.execute(
            "SELECT b.*, ds.backend, ds.update_strategy, ds.producer_job, ds.dataset_name,"
            " v.location AS version_location, v.state, v.backend AS version_backend"
            " FROM buffered_datasets b JOIN datasets ds USING (dataset_uuid)"
            " JOIN dataset_current c USING (dataset_uuid)"
            " JOIN dataset_versions v ON v.dataset_version = c.dataset_version"
            " WHERE b.org_id = %s",
            (me.org_id,),
        ).fetchall()
    made = {r["name"]: r for r in rows}
    assert sorted(made) == ["alert_deliveries", "alert_events", "mine"]
    for name, r in made.items():
        assert (r["backend"], r["version_backend"], r["update_strategy"]) == (
            "postgres",
            "postgres",
            "append",
        ), name
        assert (r["dataset_name"], r["producer_job"]) == (name, f"buffered:{name}")
        assert (r["state"], r["version_location"]) == ("complete", r["table_name"])
        assert r["queue_name"] == buffer_queue(r["dataset_uuid"])
    for pd in (ALERT_EVENTS, ALERT_DELIVERIES):
        r = made[pd.name]
        assert r["platform"] == pd.name
        assert (r["columns"], list(r["unique_key"])) == (list(pd.columns), list(pd.unique_key))
        assert (r["max_rows"], r["max_bytes"]) == (pd.max_rows, pd.max_bytes)
    assert made["alert_events"]["writers"] == ["watch.rules"]
    assert made["alert_deliveries"]["writers"] == ["watch.route"]


def _alert_events(s: Services) -> list[dict[str, Any]]:
    with s.pool.connection() as conn:
        table = conn.execute(
            "SELECT table_name FROM buffered_datasets WHERE platform = 'alert_events'"
        ).fetchone()["table_name"]
        schema, _, name = table.partition(".")
        return conn.execute(
            psycopg.sql.SQL("SELECT * FROM {} ORDER BY dag_id, job, dedupe_key").format(
                psycopg.sql.Identifier(schema, name)
            )
        ).fetchall()


def test_alerts_land_as_their_publishing_jobs_whatever_their_rows_claim(
    services: Services,
) -> None:
    """A's alert_evaluate job publishes rows claiming to be B's alerts (B's dag_id, or another
    job): they land as A's, the producer taken from the trusted record like the org. So A
    cannot squat the key of an alert B raises later: B's real alert still lands, as B's."""
    s, me = services, admin(services)
    s.control.deploy(me, dag("a"))
    s.control.deploy(me, dag("b"))
    a, b = dag_ids(s)["a"], dag_ids(s)["b"]
    squat = {**alert("k", "critical", timedelta(minutes=1)), "dag_id": b}
    elsewhere = {**alert("k2", "critical", timedelta(minutes=1)), "dag_id": b, "job": "other"}
    publish_alerts(s, [squat, elsewhere], "a")
    real = {**alert("k", "warning", timedelta(minutes=1)), "dag_id": b, "payload": {"real": 1}}
    publish_alerts(s, [real], "b")
    got = [(r["dag_id"], r["job"], r["dedupe_key"], r["org_id"]) for r in _alert_events(s)]
    assert sorted(got) == sorted(
        [(a, "rules", "k", me.org_id), (a, "rules", "k2", me.org_id), (b, "rules", "k", me.org_id)]
    )
    (mine,) = [r for r in _alert_events(s) if r["dag_id"] == b]
    assert mine["payload"] == {"real": 1} and mine["severity"] == "warning"


def test_alert_route_refuses_to_run_without_the_data_login(
    services: Services, tmp_path: Path
) -> None:
    s = services
    s.control.deploy(admin(s), DAG)
    publish_alerts(s, [alert("warn", "warning", timedelta(minutes=5))])
    (task,) = route_tasks(s)
    c = claim(s, task)
    assert c.task is not None
    ctx = OperatorContext(task=c.task, workdir=tmp_path, _send=lambda _m: None)
    with pytest.raises(PermanentError, match="trusted platform operator"):
        alert_route(ctx)


def test_a_repeated_alert_routes_nothing_new(services: Services, tmp_path: Path) -> None:
    """A second batch repeating a stored alert adds no alert row, so its routing run routes
    nothing: the delivery, its body and the alert_deliveries rows stay as they were."""
    s, me = services, admin(services)
    s.control.deploy(me, DAG)
    publish_alerts(s, [alert("warn", "warning", timedelta(minutes=5))])
    (task,) = route_tasks(s)
    route(s, tmp_path / "a", task)
    first = deliveries(s)
    publish_alerts(s, [alert("warn", "warning", timedelta(minutes=1))])  # same key, other time
    for t in route_tasks(s):
        route(s, tmp_path / str(t), t)
    assert deliveries(s) == first
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


def test_a_routed_row_whose_key_is_not_its_alerts_makes_no_delivery(
    services: Services, tmp_path: Path
) -> None:
    """What a routing task publishes is a claim: a row of alert_deliveries makes a delivery
    only when its idempotency key is the one its (org, alert, destination) derive and its
    status and severity are the platform's. A forged key (squatting another alert's key, or
    carrying a header) or status makes nothing; the row beside it still does."""
    s, me = services, admin(services)
    s.control.deploy(me, DAG)
    publish_alerts(s, [alert("warn", "warning", timedelta(minutes=5))])
    (task,) = route_tasks(s)
    c = claim(s, task)
    good = alert("warn", "warning", timedelta(minutes=5))
    good["dag_id"] = "d"

    def row(destination: str, **over: Any) -> dict[str, Any]:
        return {
            "idempotency_key": idempotency_key(me.org_id, good, destination),
            "destination": destination,
            "status": "pending",
            "alert_dag_id": "d",
            "alert_job": good["job"],
            "rule": good["rule"],
            "dedupe_key": good["dedupe_key"],
            "severity": good["severity"],
            "event_time": good["event_time"],
            "payload": {"forged": bool(over)},
            "reason": None,
            **over,
        }

    rows = [
        row("ops"),
        row("audit", idempotency_key=idempotency_key(me.org_id, good, "ops") + "x"),
        row("audit", idempotency_key="alert_1\r\nx-injected: 1"),
        row("evil", status="delivered"),
        row("evil2", severity="page_everyone"),
    ]
    key = f"{buffer_prefix(me.org_id, c.task_id, c.attempt)}forged.jsonl"
    store = make_store(s.settings)
    store.put(key, "".join(json.dumps(r) + "\n" for r in rows).encode())
    publish(s, c, "alert_deliveries", key)
    drain(s)
    got = deliveries(s)
    assert list(got) == [("ops", "warn")]
    assert json.loads(got[("ops", "warn")]["body"])["payload"] == {"forged": False}


def test_routed_rows_are_published_within_the_datasets_bounds(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More deliveries than alert_deliveries' max_rows take several batches (one batch over it
    would be refused whole by the sink, and every delivery in it lost)."""
    import dataclasses

    from trace_platform.operators import alert_route as module

    monkeypatch.setattr(
        module, "ALERT_DELIVERIES", dataclasses.replace(module.ALERT_DELIVERIES, max_rows=3)
    )
    s, me = services, admin(services)
    s.control.deploy(me, DAG)
    with s.pool.connection() as conn:  # the sink's bound, as the operator's
        conn.execute(
            "UPDATE buffered_datasets SET max_rows = 3 WHERE platform = 'alert_deliveries'"
        )
    publish_alerts(s, [alert(k, "warning", timedelta(minutes=5)) for k in ("a", "b", "c")])
    (task,) = route_tasks(s)
    route(s, tmp_path / "a", task)
    assert len(deliveries(s)) == 6  # 3 alerts x (ops, audit)
    with s.pool.connection() as conn:
        batches = conn.execute(
            "SELECT r.status, count(*) AS n FROM buffer_records r JOIN buffered_datasets b"
            " USING (dataset_uuid) WHERE b.platform = 'alert_deliveries' GROUP BY 1"
        ).fetchall()
    assert [(b["status"], b["n"]) for b in batches] == [("loaded", 2)]


def test_a_dataset_shaped_like_alert_deliveries_makes_no_delivery(services: Services) -> None:
    """Only a batch of the org's own alert_deliveries (written by alert_route) makes
    deliveries. A DAG's buffered dataset with the same columns, whose rows are deliveries the
    router would make (the key is derivable), lands as data and sends nothing: else any DAG
    could send the org's destinations what it likes, signed by the platform."""
    s, me = services, admin(services)
    cols = ", ".join(f"{{name: {c['name']}, type: {c['type']}}}" for c in ALERT_DELIVERIES.columns)
    s.control.deploy(
        me,
        "name: own\njobs:\n  w: {operator: noop, buffer_outputs: [fake_deliveries]}\n"
        f"buffered:\n  - {{name: fake_deliveries, columns: [{cols}],"
        " unique_key: [idempotency_key], writers: [own.w]}\n",
    )
    s.control.deploy(me, DAG)  # the org's alert datasets and destinations' routes exist
    (task_id,) = s.control.trigger(me, "own")["tasks"]
    c = claim(s, task_id)
    good = alert("warn", "critical", timedelta(minutes=1))
    row = {
        "idempotency_key": idempotency_key(me.org_id, good, "ops"),
        "destination": "ops",
        "status": "pending",
        "alert_dag_id": good["dag_id"],
        "alert_job": good["job"],
        "rule": good["rule"],
        "dedupe_key": good["dedupe_key"],
        "severity": good["severity"],
        "event_time": good["event_time"],
        "payload": {"forged": True},
        "reason": "-",  # a DAG's columns are required
    }
    key = f"{buffer_prefix(me.org_id, c.task_id, c.attempt)}fake.jsonl"
    make_store(s.settings).put(key, (json.dumps(row) + "\n").encode())
    publish(s, c, "fake_deliveries", key)
    drain(s)
    with s.pool.connection() as conn:
        landed = conn.execute(
            "SELECT status, error FROM buffer_records WHERE location = %s", (key,)
        ).fetchone()
    assert landed is not None and landed["status"] == "loaded", landed
    assert deliveries(s) == {} and _wakeups(s) == []
