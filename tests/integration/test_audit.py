"""The audit log (issue 42): every user and admin action leaves exactly one row, written in the
action's own transaction (a refused or failed one leaves none), naming its actor, org and
target and never a secret's value or a key; an org's admins read their org's rows alone, newest
first, and a `--since` read touches only the partitions of its months. Real Postgres, real
HTTP, no workers."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest

from tests.support.alerts import add_delivery
from tests.support.cli import trace as cli
from tests.support.dags import admin, three_jobs, user
from tests.support.servers import admin_key, bearer
from trace_platform import audit
from trace_platform.aws import container, eventbridge
from trace_platform.contract import LITE_ORG_ID, TaskSpec
from trace_platform.dag.validate import DagInvalid
from trace_platform.db.queries import Queries, literal_limit
from trace_platform.delivery.control import DeliveryControl
from trace_platform.errors import TraceError
from trace_platform.identity import create_key, ensure_user
from trace_platform.identity.vault import vault_for
from trace_platform.objectstore import make_store
from trace_platform.retention.run import Retention
from trace_platform.services import Services
from trace_platform.triggers import cron

V2 = three_jobs().replace("count: 1, final: 1", "count: 2, final: 1")  # rebuilds transform
V3 = three_jobs().replace("count: 1, final: 1", "count: 3, final: 1")


def rows(svc: Services) -> list[dict[str, Any]]:
    with svc.pool.connection() as conn:
        return conn.execute("SELECT * FROM audit_log ORDER BY id").fetchall()


def sql(svc: Services, query: str, *args: Any) -> None:
    with svc.pool.connection() as conn:
        conn.execute(query, args)  # type: ignore[arg-type]


def test_each_action_leaves_one_row_naming_its_actor_org_and_target(services: Services) -> None:
    svc, a = services, admin(services)
    cp = svc.control
    dc = DeliveryControl(svc.pool, vault_for(svc.settings))
    got: dict[str, Any] = {}

    def keep(name: str, value: Any) -> Any:
        got[name] = value
        return value

    def ad_hoc_task() -> Any:
        return keep("task", cp.create_task(a, TaskSpec(job="adhoc", operator="noop")))

    def failed_delivery() -> None:
        with svc.pool.connection() as conn:
            did = add_delivery(
                conn, a.org_id, key="k", status="failed", reason="HTTP 500", rule="r",
                severity="warning", body="{}",
            )  # fmt: skip
        keep("delivery", did)
        dc.retry(a, did)

    now = datetime.now(UTC).replace(second=0, microsecond=0)

    def eventbridge_tick() -> Any:
        sql(svc, "UPDATE cron_state SET last_fire_at = %s", now - timedelta(hours=1))
        event = {"org": "lite", "dag": "hello", "trigger": "minutely"}
        at = (now - timedelta(minutes=5)).isoformat()
        context = SimpleNamespace(aws_request_id="lambda-req-1")
        container.install(svc)
        try:
            return eventbridge.handler({**event, "scheduled_time": at}, context)
        finally:
            container.install(None)

    def retention() -> Any:
        # One old month and nothing in it: the one before last, made here.
        sql(svc, "SELECT trace_ensure_partitions(2, 2)")
        this_month = datetime.now(UTC).date().replace(day=1)
        first_of_last = (this_month - timedelta(days=1)).replace(day=1)
        days = (datetime.now(UTC).date() - first_of_last).days
        (month,) = Retention(svc.dsn, make_store(svc.settings)).run(days, export=True)
        return keep("month", month.label)

    # (what is done, the action, its target, the actor's name, its source)
    Step = tuple[str, Callable[[], Any], str, Callable[[], str] | str, str, str]
    steps: list[Step] = [
        ("deploy", lambda: cp.deploy(a, three_jobs()), "dag.deploy", "hello", "admin", "cli"),
        ("diff", lambda: cp.deploy(a, V2, dry_run=True), "dag.diff", "hello", "admin", "cli"),
        ("deploy v2", lambda: cp.deploy(a, V2, manual_cutover=True), "dag.deploy", "hello",
         "admin", "cli"),
        ("cutover", lambda: cp.changes.cutover(a, "hello"), "dag.cutover", "hello", "admin",
         "cli"),
        ("rollback", lambda: cp.changes.rollback(a, "hello"), "dag.rollback", "hello", "admin",
         "cli"),
        ("pause", lambda: cp.changes.set_paused(a, "hello", True), "dag.pause", "hello", "admin",
         "cli"),
        ("resume", lambda: cp.changes.set_paused(a, "hello", False), "dag.resume", "hello",
         "admin", "cli"),
        ("deploy v3", lambda: cp.deploy(a, V3), "dag.deploy", "hello", "admin", "cli"),
        ("automatic cutover", lambda: cp.changes.auto_cutover(), "dag.cutover", "hello",
         "system", "system"),
        ("deploy roles", lambda: cp.set_deploy_roles(a, "hello", ["team"]), "dag.deploy_roles",
         "hello", "admin", "cli"),
        ("trigger", lambda: keep("run", cp.trigger(a, "hello")), "dag.trigger", "hello", "admin",
         "cli"),
        ("webhook", lambda: cp.trigger(a, "hello", trigger="poke", kind="webhook"),
         "dag.trigger", "hello", "admin", "cli"),
        ("eventbridge", eventbridge_tick, "dag.trigger", "hello", "eventbridge", "eventbridge"),
        ("scheduler", lambda: cron.tick(svc.dispatcher), "dag.trigger", "hello", "scheduler",
         "scheduler"),
        ("backfill plan", lambda: cp.changes.backfill(a, "hello", jobs=["transform"],
         dry_run=True), "dag.backfill", "hello", "admin", "cli"),
        ("run cancel", lambda: cp.cancel_run(a, got["run"]["run_id"]), "run.cancel",
         lambda: str(got["run"]["run_id"]), "admin", "cli"),
        ("run retry", lambda: cp.retry_run(a, got["run"]["run_id"]), "run.retry",
         lambda: str(got["run"]["run_id"]), "admin", "cli"),
        ("task create", ad_hoc_task, "task.create", lambda: str(got["task"].task_id), "admin",
         "cli"),
        ("task cancel", lambda: cp.cancel_task(a, got["task"].task_id), "task.cancel",
         lambda: str(got["task"].task_id), "admin", "cli"),
        ("read roles", lambda: cp.set_read_roles(a, "hello_raw", ["analysts"], []),
         "dataset.read_roles", "hello_raw", "admin", "cli"),
        ("purge", lambda: cp.purge_versions(a, "hello_clean", keep=1), "dataset.purge",
         "hello_clean", "admin", "cli"),
        ("name grant", lambda: cp.grant_name(a, "team_*", role="team"), "name.grant", "team_*",
         "admin", "cli"),
        ("name revoke", lambda: cp.revoke_name(a, "team_*", role="team"), "name.revoke",
         "team_*", "admin", "cli"),
        ("name reclaim", lambda: cp.reclaim_name(a, "hello_clean"), "name.reclaim",
         "hello_clean", "admin", "cli"),
        ("secret set", lambda: cp.set_secret(a, "rpc_token", "v"), "secret.set", "rpc_token",
         "admin", "cli"),
        ("user add", lambda: cp.add_user(a, "carol", ["team"]), "user.add", "carol", "admin",
         "cli"),
        ("key create", lambda: keep("key", cp.identity.create_key(a, "carol", name="ci")),
         "key.create", lambda: got["key"]["key_id"], "admin", "cli"),
        ("key rotate", lambda: keep("rotated", cp.identity.rotate_key(a, UUID(got["key"]["key_id"]))),
         "key.rotate", lambda: got["key"]["key_id"], "admin", "cli"),
        ("key revoke", lambda: cp.identity.revoke_key(a, UUID(got["rotated"]["key_id"])),
         "key.revoke", lambda: got["rotated"]["key_id"], "admin", "cli"),
        ("user remove", lambda: cp.identity.remove_user(a, "carol"), "user.remove", "carol",
         "admin", "cli"),
        ("destination add", lambda: dc.add_destination(a, "ops", "https://hooks.example.com/x"),
         "destination.add", "ops", "admin", "cli"),
        ("destination change", lambda: dc.set_destination(a, "ops", enabled=False),
         "destination.change", "ops", "admin", "cli"),
        ("delivery retry", failed_delivery, "delivery.retry", lambda: str(got["delivery"]),
         "admin", "cli"),
        ("retention", retention, "retention.drop", lambda: got["month"], "system", "cli"),
    ]  # fmt: skip
    assert {s[2] for s in steps} == set(audit.ACTIONS)  # every action of the vocabulary
    for what, act, action, target, actor, source in steps:
        before = {r["id"] for r in rows(svc)}
        act()
        new = [r for r in rows(svc) if r["id"] not in before]
        assert len(new) == 1, f"{what}: {len(new)} rows: {new}"
        (row,) = new
        want_target = target() if callable(target) else target
        assert (row["action"], row["target"], row["actor_name"], row["source"]) == (
            action,
            want_target,
            actor,
            source,
        ), what
        assert row["org_id"] == LITE_ORG_ID, what
        assert row["target_kind"] == audit.ACTIONS[action], what
        assert row["actor_user_id"] == (a.user_id if actor == "admin" else None), what
        assert row["start_day"] == audit.start_day(row["at"]), what
    by_action = {r["action"]: r for r in rows(svc)}
    assert by_action["dag.diff"]["details"]["version"] == 2
    assert by_action["dag.backfill"]["outcome"] == "dry_run"
    assert by_action["task.cancel"]["outcome"] == "ok"
    assert by_action["run.cancel"]["dag"] == "hello"
    assert by_action["dag.trigger"]["details"]["kind"] == "cron"  # the scheduler's, last
    eb = [r for r in rows(svc) if r["actor_name"] == "eventbridge"]
    assert [r["request_id"] for r in eb] == ["lambda-req-1"]


def test_a_refused_or_failed_action_leaves_no_row(services: Services) -> None:
    """Decided: a row is written in the action's transaction, so only a committed action has
    one; a refusal (permission, a bad input, a conflict) or a failure leaves none."""
    svc, a = services, admin(services)
    cp = svc.control
    cp.deploy(a, three_jobs())
    bob, _ = user(svc, "bob")
    before = rows(svc)
    refused: list[Callable[[], Any]] = [
        lambda: cp.set_read_roles(bob, "hello_raw", ["x"], []),  # not an admin
        lambda: cp.add_user(bob, "mallory", [], is_admin=True),
        lambda: cp.trigger(a, "nope"),  # no such DAG
        lambda: cp.deploy(a, "name: [broken"),  # invalid
        lambda: cp.set_secret(a, "s", ""),  # empty value
        lambda: cp.changes.cutover(a, "hello"),  # no rebuild in flight
        lambda: cp.identity.remove_user(a, "admin"),  # the org's last admin
        lambda: cp.grant_name(a, "x", user="nobody"),
    ]
    for act in refused:
        with pytest.raises((TraceError, DagInvalid)):
            act()
    assert rows(svc) == before
    # A row written and then the action failing in the same transaction: gone with it.
    with pytest.raises(RuntimeError), svc.pool.connection() as conn, conn.transaction():
        audit.record(conn, a, "dag.pause", "hello")
        raise RuntimeError("the action fails after its row was written")
    assert rows(svc) == before
    # And never outside a transaction (it could not be the action's).
    with svc.pool.connection() as conn:
        conn.autocommit = True
        with pytest.raises(RuntimeError, match="inside the action's transaction"):
            audit.record(conn, a, "dag.pause", "hello")


def test_secret_values_and_keys_never_reach_the_log(services: Services) -> None:
    svc, a = services, admin(services)
    cp = svc.control
    dc = DeliveryControl(svc.pool, vault_for(svc.settings))
    cp.deploy(a, three_jobs())
    shown = [
        "s3cr3t-VALUE-4f1e",
        cp.add_user(a, "carol", ["team"])["api_key"],
        cp.identity.create_key(a, "carol")["api_key"],
    ]
    cp.set_secret(a, "rpc_token", shown[0])
    cp.set_secret(a, "rpc_token", "s3cr3t-VALUE-second", use_roles=["team"])
    shown.append("s3cr3t-VALUE-second")
    first = cp.identity.list_keys(a, user="carol")[0]["key_id"]
    shown.append(cp.identity.rotate_key(a, first)["api_key"])
    shown.append(dc.add_destination(a, "ops", "https://hooks.example.com/in?token=tok-QUERY-77"))
    shown.append("tok-QUERY-77")
    shown.append(dc.set_destination(a, "ops", rotate_secret=True) or "")
    cp.trigger(a, "hello", config={"password": "cfg-SECRET-9"})
    shown.append("cfg-SECRET-9")
    with svc.pool.connection() as conn:
        text = conn.execute("SELECT string_agg(a::text, ' ') AS t FROM audit_log a").fetchone()
    assert text is not None and text["t"]
    for value in shown:
        assert value and value not in text["t"], value
    assert "rpc_token" in text["t"] and "hooks.example.com" in text["t"]  # names, hosts: kept
    # A credential field is refused outright, however deep.
    for details in ({"value": "x"}, {"ok": [{"api_key": "x"}]}, {"Secret": 1}):
        with (
            pytest.raises(ValueError, match="may not hold"),
            svc.pool.connection() as conn,
            conn.transaction(),
        ):
            audit.record(conn, a, "secret.set", "s", details)
    # Bounded: a huge detail is cut, the action still recorded.
    assert len(json.dumps(audit.bounded({"n": 1, "big": ["x" * 200] * 500}))) < 8192


@pytest.fixture
def other_admin(services: Services) -> tuple[UUID, str]:
    """Another org and its admin's key."""
    other = uuid.uuid4()
    with services.pool.connection() as conn, conn.transaction():
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'other')", (other,))
        eve = ensure_user(conn, other, "eve", is_admin=True)
        return other, create_key(conn, eve.user_id)


def test_over_http_admins_read_their_org_alone_newest_first(
    secure: tuple[Services, str], other_admin: tuple[UUID, str]
) -> None:
    svc, url = secure
    key = admin_key(svc)
    _, eve_key = other_admin
    _, bob_key = user(svc, "bob")
    svc.control.deploy(admin(svc), three_jobs())
    with httpx.Client(base_url=url, timeout=30) as http:
        r = http.post("/v1/dags/hello/trigger", headers={**bearer(key), "X-Request-Id": "req-42"})
        assert r.status_code == 201, r.text
        assert r.headers["x-request-id"] == "req-42"
        r = http.post("/v1/hooks/hello/poke", json={}, headers=bearer(key))
        assert r.status_code == 201, r.text
        made = r.headers["x-request-id"]
        # eve acts in her own org: her row is hers alone
        r = http.put("/v1/secrets/evesecret", json={"value": "x"}, headers=bearer(eve_key))
        assert r.is_success, r.text

        page = http.get("/v1/audit", headers=bearer(key)).json()
        entries = page["entries"]
        assert [e["action"] for e in entries] == ["dag.trigger", "dag.trigger", "dag.deploy"]
        assert [(e["source"], e["request_id"]) for e in entries] == [
            ("webhook", made),
            ("http", "req-42"),
            ("cli", None),
        ]
        assert page["next"] is None
        # The key each call came with (the deploy was in-process, as the Lite admin, keyless).
        assert [e["actor_key_id"] is not None for e in entries] == [True, True, False]
        assert "org_id" not in entries[0]
        assert [e["actor"] for e in http.get("/v1/audit", headers=bearer(eve_key)).json()[
            "entries"
        ]] == ["eve"]  # fmt: skip
        # Pages: one row each, following `next`, newest first, none twice.
        seen, before = [], None
        while True:
            params: dict[str, Any] = {"limit": 1, **({"before": before} if before else {})}
            p = http.get("/v1/audit", params=params, headers=bearer(key)).json()
            seen += [e["id"] for e in p["entries"]]
            before = p["next"]
            if before is None:
                break
        assert seen == [e["id"] for e in entries]

        # Filters.
        def ids(**q: Any) -> list[int]:
            r = http.get("/v1/audit", params=q, headers=bearer(key))
            assert r.status_code == 200, r.text
            return [e["id"] for e in r.json()["entries"]]

        assert ids(action="dag.deploy") == [entries[2]["id"]]
        assert ids(actor="admin", dag="hello", since="1h") == seen
        assert ids(actor="nobody") == [] and ids(dag="other") == []
        assert ids(since=(datetime.now(UTC) + timedelta(hours=1)).isoformat()) == []
        for bad in ({"since": "yesterday"}, {"action": "dag.explode"}, {"before": "x"}):
            r = http.get("/v1/audit", params=bad, headers=bearer(key))
            assert r.status_code == 422, r.text
            assert next(iter(bad)) in r.json()["message"]
        # A non-admin is refused, a caller with no key is unknown.
        assert http.get("/v1/audit", headers=bearer(bob_key)).status_code == 403
        assert http.get("/v1/audit").status_code == 401


def _partitions(plan: list[dict[str, Any]]) -> set[str]:
    return set(re.findall(r"audit_log_\d{4}_\d{2}", " ".join(r["QUERY PLAN"] for r in plan)))


def test_a_since_read_touches_only_the_partitions_of_its_months(services: Services) -> None:
    with services.pool.connection() as conn:
        conn.execute("SELECT trace_ensure_partitions(2, 6)")  # half a year of older months
        query = literal_limit(Queries("audit").list, 51)
        now = datetime.now(UTC)

        def plan(since: str | None, before: str | None = None) -> set[str]:
            params = {
                "org_id": LITE_ORG_ID,
                "actor": None,
                "actor_kind": None,
                "action": None,
                "dag": None,
                **audit.read_bounds(since, before, now),
            }
            return _partitions(conn.execute("EXPLAIN " + query, params).fetchall())

        def month(at: datetime) -> str:
            return f"audit_log_{at:%Y_%m}"

        recent = plan("1h")
        assert recent and recent <= {month(now), month(now + timedelta(days=1))}, recent
        everything = plan(None)
        assert len(everything) >= 7 and everything > recent, everything  # no pruning without
        # A page further back reads from its cursor's month down, never the newer months.
        old = now - timedelta(days=70)
        cursor = audit.encode_cursor({"at": old, "id": 5})
        back = plan(None, cursor)
        assert month(old) in back and month(now) not in back, back


def test_an_action_in_a_month_without_its_partition_makes_it(services: Services) -> None:
    """Partition upkeep runs in the Dispatcher's reaper; a CLI-only install still records."""
    svc = services
    month = f"audit_log_{datetime.now(UTC):%Y_%m}"
    sql(svc, f"DROP TABLE {month}")
    svc.control.deploy(admin(svc), three_jobs())
    assert [r["action"] for r in rows(svc)] == ["dag.deploy"]
    with svc.pool.connection() as conn:
        assert conn.execute("SELECT to_regclass(%s) AS t", (month,)).fetchone()["t"]  # type: ignore[index]


def test_trace_audit_list(services: Services) -> None:
    svc, a = services, admin(services)
    svc.control.deploy(a, three_jobs())
    svc.control.set_secret(a, "rpc_token", "v")
    env = {"TRACE_STATE_DSN": svc.dsn, "TRACE_HOME": str(svc.settings.home)}
    out = cli(["audit", "list", "--json", "--action", "dag.deploy"], env)
    assert out.returncode == 0, out.stderr
    page = json.loads(out.stdout)
    assert [(e["action"], e["actor"], e["target"]) for e in page["entries"]] == [
        ("dag.deploy", "admin", "hello")
    ]
    out = cli(["audit", "list", "--since", "1h"], env)
    assert out.returncode == 0, out.stderr
    assert "secret.set" in out.stdout and "rpc_token" in out.stdout and "dag.deploy" in out.stdout


def test_the_partition_key_and_timestamp_agree(services: Services) -> None:
    """The table refuses a row whose start_day is not its time's day (the key prunes reads)."""
    with services.pool.connection() as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "INSERT INTO audit_log (start_day, org_id, actor_kind, actor_name, action,"
            " target_kind, target, source) VALUES (trace_start_day(now()) - 1, %s, 'system',"
            " 'system', 'dag.pause', 'dag', 'x', 'system')",
            (LITE_ORG_ID,),
        )
