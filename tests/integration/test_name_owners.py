"""Published names have owners (issue 38, Medium): the platform's reserved names are published
only by an admin's deploy or a grantee's, an admin grants names and prefixes and takes a
squatted name back, and the platform's saved queries read only the DAG that must produce what
they read. Real Postgres, real HTTP, no workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa

from tests.support.cli import trace as cli
from tests.support.dags import admin, user
from tests.support.datasets import commit_parquet
from tests.support.servers import admin_key, bearer
from trace_platform.config import Settings
from trace_platform.services import Services

PUBLISHER = (
    "name: {dag}\njobs:\n  p: {{operator: noop, outputs: [{{backend: parquet}}]}}\n"
    "publish:\n  - {{job: p, output_index: 0, dataset: {name}}}\n"
)


def deploy(url: str, key: str, dag: str, name: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/dags", json={"yaml": PUBLISHER.format(dag=dag, name=name)}, headers=bearer(key)
    )


def names_call(url: str, key: str, path: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/names/{path}", json=body, headers=bearer(key))


def row(svc: Services, query: str, *args: Any) -> dict[str, Any] | None:
    with svc.pool.connection() as conn:
        return conn.execute(query, args).fetchone()  # type: ignore[arg-type]


def test_a_no_role_user_may_not_squat_a_reserved_name(secure: tuple[Services, str]) -> None:
    svc, url = secure
    _, bob = user(svc, "bob")
    r = deploy(url, bob, "squat", "token_supply")
    assert r.status_code == 403, r.text
    message = r.json()["message"]
    assert "'bob' may not publish 'token_supply'" in message
    assert "only an org admin (admin)" in message  # who may grant it
    assert "trace names grant token_supply --user bob" in message
    assert row(svc, "SELECT 1 FROM dags WHERE name = 'squat'") is None  # nothing deployed
    # A name no one reserved or granted stays free, as before grants existed.
    assert deploy(url, bob, "bobs", "bobs_prices").is_success


def test_a_grant_lets_a_user_or_a_role_publish(secure: tuple[Services, str]) -> None:
    svc, url = secure
    _, bob = user(svc, "bob")
    _, carol = user(svc, "carol", roles=["team_a"])
    _, dave = user(svc, "dave")
    # Only an admin grants.
    assert names_call(url, bob, "grants", pattern="token_supply", user="bob").status_code == 403
    r = names_call(url, admin_key(svc), "grants", pattern="token_supply", user="bob")
    assert r.status_code == 200, r.text
    assert deploy(url, bob, "bobs_supply", "token_supply").is_success
    r = names_call(url, admin_key(svc), "grants", pattern="team_a_*", role="team_a")
    assert r.status_code == 200, r.text
    assert deploy(url, carol, "carols", "team_a_prices").is_success
    # The org has grants now: names are the admins' to give, a prefix is its grantees'.
    assert deploy(url, dave, "daves", "team_a_other").status_code == 403
    assert deploy(url, dave, "daves", "daves_prices").status_code == 403
    listed = httpx.get(f"{url}/v1/names", headers=bearer(dave)).json()
    assert {(g["pattern"], g["user"], g["role"]) for g in listed["grants"]} == {
        ("token_supply", "bob", None),
        ("team_a_*", None, "team_a"),
    }
    assert "token_supply" in listed["reserved"]
    # A revoked grant publishes nothing new.
    r = names_call(url, admin_key(svc), "revoke", pattern="team_a_*", role="team_a")
    assert r.status_code == 200, r.text
    assert deploy(url, carol, "carols2", "team_a_more").status_code == 403


def test_an_admin_reclaims_a_squatted_name_then_deploys(secure: tuple[Services, str]) -> None:
    svc, url = secure
    _, bob = user(svc, "bob")
    key = admin_key(svc)
    # Squatted while free (no grants in the org): the admin's deploy is refused.
    assert deploy(url, bob, "squat", "prices").is_success
    before = row(svc, "SELECT dataset_uuid FROM datasets WHERE dataset_name = 'prices'")
    assert before is not None
    refused = deploy(url, key, "platform", "prices")
    assert refused.status_code == 422 and "produced by DAG 'squat'" in refused.text
    # Only an admin takes a name back.
    assert names_call(url, bob, "prices/reclaim").status_code == 403
    r = names_call(url, key, "prices/reclaim")
    assert r.status_code == 200, r.text
    assert r.json()["dag"] == "squat"
    # The dataset keeps its uuid (and data); only the name went.
    kept = row(
        svc, "SELECT dataset_name FROM datasets WHERE dataset_uuid = %s", before["dataset_uuid"]
    )
    assert kept == {"dataset_name": None}
    # The squatter's deploys no longer publish it; the admin's now does.
    again = deploy(url, bob, "squat", "prices")
    assert again.status_code == 403 and "a name an admin reclaimed" in again.text
    r = deploy(url, key, "platform", "prices")
    assert r.is_success, r.text
    now = row(
        svc,
        "SELECT d.name FROM datasets ds JOIN dags d ON d.dag_id = ds.producer_dag_id "
        "WHERE ds.dataset_name = 'prices'",
    )
    assert now == {"name": "platform"}


def supply() -> pa.Table:
    return pa.table(
        {
            "token_address": pa.array(["0xabc"], pa.string()),
            "block_number": pa.array([5], pa.int64()),
            "total_supply": pa.array([666], pa.int64()),
        }
    )


def test_a_saved_query_refuses_a_name_another_dag_produces(secure: tuple[Services, str]) -> None:
    svc, url = secure
    key = admin_key(svc)
    me = admin(svc)
    # An admin's other DAG publishes token_supply (an admin may); its numbers are not the
    # platform DAG's.
    svc.control.deploy(me, PUBLISHER.format(dag="other", name="token_supply"))
    commit_parquet(svc, "token_supply", supply(), 0, 10)
    r = httpx.post(f"{url}/v1/query", json={"saved": "token_supplies"}, headers=bearer(key))
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "from DAG 'monad_demo', but DAG 'other' publishes it" in message
    assert "666" not in r.text
    # Plain SQL still reads whatever the name holds (the caller chose it).
    sql = {"sql": "SELECT total_supply FROM token_supply"}
    assert httpx.post(f"{url}/v1/query", json=sql, headers=bearer(key)).json()["rows"] == [[666]]
    # Published by the platform's DAG, the saved query answers.
    assert names_call(url, key, "token_supply/reclaim").status_code == 200
    svc.control.deploy(me, PUBLISHER.format(dag="monad_demo", name="token_supply"))
    commit_parquet(svc, "token_supply", supply(), 0, 10)
    r = httpx.post(f"{url}/v1/query", json={"saved": "token_supplies"}, headers=bearer(key))
    assert r.status_code == 200, r.text
    assert r.json()["rows"][0][0] == "0xabc"


def test_a_rollback_of_the_squatting_dag_does_not_publish_a_reclaimed_name(
    services: Services,
) -> None:
    bob, _ = user(services, "bob")
    services.control.deploy(bob, PUBLISHER.format(dag="squat", name="prices"))
    # An execution-only change: live at once, version 2.
    v2 = PUBLISHER.format(dag="squat", name="prices").replace("noop,", "noop, max_attempts: 2,")
    services.control.deploy(bob, v2)
    services.control.reclaim_name(admin(services), "prices")
    services.control.changes.rollback(bob, "squat", 1)
    assert row(services, "SELECT 1 FROM datasets WHERE dataset_name = 'prices'") is None


def test_cli_names_grant_list_and_reclaim(dsn: str, tmp_path: Path) -> None:
    env = {"TRACE_STATE_DSN": dsn, "TRACE_HOME": str(tmp_path)}
    svc = Services.build(Settings(state_dsn=dsn, home=tmp_path), dsn)
    try:
        bob, bob_key = user(svc, "bob")
        svc.control.deploy(bob, PUBLISHER.format(dag="squat", name="prices"))
    finally:
        svc.close()
    r = cli(["names", "grant", "team_a_*", "--role", "team_a"], env)
    assert r.returncode == 0 and "granted team_a_* to role team_a" in r.stdout, r.stdout + r.stderr
    r = cli(["names", "list"], env)
    assert r.returncode == 0 and "team_a_*" in r.stdout and "token_supply" in r.stdout, r.stdout
    r = cli(["names", "reclaim", "prices"], {**env, "TRACE_API_KEY": bob_key})
    assert r.returncode == 1 and "only org admins may reclaim" in r.stdout, r.stdout
    r = cli(["names", "reclaim", "prices"], env)
    assert r.returncode == 0 and "reclaimed prices from DAG squat" in r.stdout, r.stdout
