"""Destinations, deliveries, alerts and buffer records over the HTTP API (a real server that
requires keys, a real Postgres): the same control operations as the CLI. Destinations and
deliveries are an org admin's: a non-admin gets 403 and changes nothing; another org's admin
sees none of them and touches none. Alerts and buffer records follow read_roles."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from tests.support.alerts import add_delivery, alert, dag, publish_alerts
from tests.support.dags import admin, user
from tests.support.servers import admin_key, bearer, secured_api
from trace_platform.config import Settings
from trace_platform.identity import create_key, ensure_user
from trace_platform.services import Services


@pytest.fixture
def api(settings: Settings, dsn: str) -> Iterator[tuple[Services, dict[str, httpx.Client]]]:
    """The API, and a client for each caller: the org's admin, a user of the org with no
    roles, the admin of another org, and a caller with no key."""
    with secured_api(settings, dsn) as (svc, url):
        _, someone = user(svc, "someone")
        other = uuid.uuid4()
        with svc.pool.connection() as conn, conn.transaction():
            conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, %s)", (other, "other"))
            eve = ensure_user(conn, other, "eve", is_admin=True)
            eve_key = create_key(conn, eve.user_id)
        clients = {
            who: httpx.Client(base_url=url, headers=bearer(key), timeout=30)
            for who, key in (("admin", admin_key(svc)), ("someone", someone), ("other", eve_key))
        }
        clients["nobody"] = httpx.Client(base_url=url, timeout=30)
        try:
            yield svc, clients
        finally:
            for c in clients.values():
                c.close()


def _failed_delivery(s: Services) -> uuid.UUID:
    with s.pool.connection() as conn:
        return add_delivery(
            conn,
            admin(s).org_id,
            key="alert_k",
            status="failed",
            reason="HTTP 500",
            rule="big",
            severity="warning",
            body='{"type":"alert"}',
        )


def _state(s: Services) -> list[Any]:
    with s.pool.connection() as conn:
        return [
            conn.execute("SELECT * FROM destinations ORDER BY name").fetchall(),
            conn.execute("SELECT * FROM deliveries ORDER BY delivery_id").fetchall(),
        ]


def test_an_admin_manages_destinations_and_deliveries_over_http(
    api: tuple[Services, dict[str, httpx.Client]],
) -> None:
    s, c = api
    me = c["admin"]
    made = me.post("/v1/destinations", json={"name": "ops", "url": "https://example.org/hook"})
    assert made.status_code == 201, made.text
    assert made.json()["name"] == "ops" and made.json()["secret"].startswith("whsec_")
    listed = me.get("/v1/destinations").json()
    assert [(d["name"], d["url"], d["enabled"]) for d in listed] == [
        ("ops", "https://example.org/hook", True)
    ]
    assert "secret" not in listed[0]
    assert me.post("/v1/destinations/ops/disable").json() == {"name": "ops", "enabled": False}
    assert me.get("/v1/destinations").json()[0]["enabled"] is False
    assert me.post("/v1/destinations/ops/enable").json() == {"name": "ops", "enabled": True}
    rotated = me.post("/v1/destinations/ops/rotate-secret").json()["secret"]
    assert rotated.startswith("whsec_") and rotated != made.json()["secret"]
    # Refused as the control plane refuses them: a private address, a taken name, a bad name.
    private = me.post("/v1/destinations", json={"name": "lan", "url": "http://10.0.0.1/h"})
    assert private.status_code == 201  # saved; refused at send time unless allowed
    again = me.post("/v1/destinations", json={"name": "ops", "url": "https://example.org/x"})
    assert again.status_code == 409 and again.json()["error"] == "destination_exists"
    assert me.post("/v1/destinations/Bad%20Name/disable").status_code == 422
    assert me.post("/v1/destinations/nope/disable").status_code == 404

    did = _failed_delivery(s)
    (row,) = me.get("/v1/deliveries").json()
    assert (row["delivery_id"], row["status"]) == (str(did), "failed")
    assert me.get("/v1/deliveries", params={"status": "delivered"}).json() == []
    assert me.get("/v1/deliveries", params={"status": "lost"}).status_code == 422
    shown = me.get(f"/v1/deliveries/{did}").json()
    assert shown["body"] == '{"type":"alert"}' and shown["attempt_log"] == []
    assert me.post(f"/v1/deliveries/{did}/retry").json() == {
        "delivery_id": str(did),
        "status": "pending",
    }
    assert me.get(f"/v1/deliveries/{did}").json()["status"] == "pending"
    twice = me.post(f"/v1/deliveries/{did}/retry")
    assert twice.status_code == 409 and twice.json()["error"] == "not_failed"
    assert me.get(f"/v1/deliveries/{uuid.uuid4()}").status_code == 404
    assert me.post(f"/v1/deliveries/{uuid.uuid4()}/retry").status_code == 404


def test_a_non_admin_is_refused_and_another_orgs_admin_sees_nothing(
    api: tuple[Services, dict[str, httpx.Client]],
) -> None:
    s, c = api
    c["admin"].post("/v1/destinations", json={"name": "ops", "url": "https://example.org/hook"})
    did = _failed_delivery(s)
    before = _state(s)

    def calls(client: httpx.Client) -> dict[str, httpx.Response]:
        return {
            "add": client.post(
                "/v1/destinations", json={"name": "evil", "url": "https://evil.example/"}
            ),
            "list": client.get("/v1/destinations"),
            "disable": client.post("/v1/destinations/ops/disable"),
            "enable": client.post("/v1/destinations/ops/enable"),
            "rotate": client.post("/v1/destinations/ops/rotate-secret"),
            "deliveries": client.get("/v1/deliveries"),
            "show": client.get(f"/v1/deliveries/{did}"),
            "retry": client.post(f"/v1/deliveries/{did}/retry"),
        }

    refused = calls(c["someone"])
    assert {k: r.status_code for k, r in refused.items()} == {k: 403 for k in refused}
    assert all(r.json()["error"] == "forbidden" for r in refused.values())
    anonymous = calls(c["nobody"])
    assert {k: r.status_code for k, r in anonymous.items()} == {k: 401 for k in anonymous}
    # Another org's admin: its own (empty) org, none of this one's by name or id.
    other = calls(c["other"])
    assert other["add"].status_code == 201  # in its own org: the one it lists
    assert [d["name"] for d in other["list"].json()] == ["evil"]
    assert other["deliveries"].json() == []
    codes = {k: other[k].status_code for k in ("disable", "enable", "rotate", "show", "retry")}
    assert codes == {"disable": 404, "enable": 404, "rotate": 404, "show": 404, "retry": 404}
    # Answered exactly as for a delivery that does not exist: nothing tells that it does.
    unknown = uuid.uuid4()
    like_none = {
        "show": c["other"].get(f"/v1/deliveries/{unknown}"),
        "retry": c["other"].post(f"/v1/deliveries/{unknown}/retry"),
    }
    for k, r in like_none.items():
        assert other[k].text.replace(str(did), "?") == r.text.replace(str(unknown), "?"), k
    after = _state(s)
    assert [d for d in after[0] if d["org_id"] == admin(s).org_id] == before[0]
    assert after[1] == before[1]  # no delivery changed
    assert c["admin"].get("/v1/destinations").json()[0]["url"] == "https://example.org/hook"


def test_alerts_and_buffer_records_over_http_follow_read_roles(
    api: tuple[Services, dict[str, httpx.Client]],
) -> None:
    s, c = api
    s.control.deploy(admin(s), dag())
    publish_alerts(s, [alert("a", "warning", timedelta(minutes=1))])
    got = c["admin"].get("/v1/alerts", params={"rule": "big"})
    assert got.status_code == 200, got.text
    res = got.json()
    names = [col["name"] for col in res["columns"]]
    (row,) = [dict(zip(names, r, strict=True)) for r in res["rows"]]
    assert (row["rule"], row["severity"], row["dedupe_key"]) == ("big", "warning", "a")
    assert c["admin"].get("/v1/alerts", params={"rule": "other"}).json()["rows"] == []
    assert c["admin"].get("/v1/alerts", params={"rule": "x'--"}).status_code == 422
    (rec,) = c["admin"].get("/v1/buffers").json()
    assert (rec["dataset"], rec["status"]) == ("alert_events", "loaded")
    assert c["admin"].get("/v1/buffers", params={"status": "dead"}).json() == []
    assert c["admin"].get("/v1/buffers", params={"status": "gone"}).status_code == 422
    for path in ("/v1/alerts", "/v1/buffers"):
        assert c["nobody"].get(path).status_code == 401, path
    # No read_roles on alert_events: nothing of it; another org: nothing of this one's.
    for who in ("someone", "other"):
        assert c[who].get("/v1/buffers").json() == [], who
        refused = c[who].get("/v1/alerts")
        assert refused.status_code == 404, (who, refused.text)
        assert "warning" not in refused.text
