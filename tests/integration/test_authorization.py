"""Who sees what, and who may use which secret: against a real Postgres, over HTTP and the CLI.

A user without roles must not learn anything of another user's DAG, runs or tasks (404, the
same as for something that does not exist), must not name another user's secret in their
own DAG, and a revoked use_role stops the secret at the next task. Secret values are sealed at
rest and never listed."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.cli import trace as cli
from tests.support.dags import admin, three_jobs, user
from tests.support.servers import admin_key, bearer, empty_database
from trace_platform.config import Settings
from trace_platform.contract import LITE_ORG_ID, ClaimRequest, LeaseRef
from trace_platform.db import migrate as mig
from trace_platform.errors import Invalid
from trace_platform.identity import Actor, Forbidden, create_key, ensure_user, set_roles
from trace_platform.identity.vault import key_file
from trace_platform.services import Services

POOLED = """
name: {name}
worker_pools:
  rpc:
    - {{env: {{RPC_URL: "http://rpc"}}, secrets: {{TOKEN: {secret}}}}}
jobs:
  a: {{operator: noop, worker_pool: rpc}}
"""


def q(services: Services, query: str, *args: Any) -> list[dict[str, Any]]:
    with services.pool.connection() as conn:
        return conn.execute(query, args).fetchall()  # type: ignore[arg-type]


def count(services: Services, table: str) -> int:
    return int(q(services, f"SELECT count(*) AS n FROM {table}")[0]["n"])


def refreshed(services: Services, actor: Actor) -> Actor:
    """The user as they are now (roles change under a held Actor)."""
    a, _ = user(services, actor.name)
    return a


def same_404(
    hidden: httpx.Response, unknown: httpx.Response, hidden_id: str, unknown_id: str
) -> None:
    """Not visible answers exactly like nonexistent: same status, same body but for the id."""
    assert hidden.status_code == unknown.status_code == 404
    expected = unknown.json()
    expected["message"] = expected["message"].replace(unknown_id, hidden_id)
    assert hidden.json() == expected


# -- who sees what ----------------------------------------------------------------------------
def test_no_role_user_cannot_see_or_cancel_anothers_runs_tasks_or_spec(
    secure: tuple[Services, str],
) -> None:
    svc, url = secure
    cp, me = svc.control, admin(svc)
    cp.deploy(me, three_jobs())
    run = cp.trigger(me, "hello")
    run_id, task_id = str(run["run_id"]), str(run["tasks"][0])
    _, bob_key = user(svc, "bob")
    as_bob = bearer(bob_key)
    unknown = str(uuid.uuid4())

    assert httpx.get(f"{url}/v1/runs", headers=as_bob).json() == []
    same_404(
        httpx.get(f"{url}/v1/runs/{run_id}", headers=as_bob),
        httpx.get(f"{url}/v1/runs/{unknown}", headers=as_bob),
        run_id,
        unknown,
    )
    same_404(
        httpx.get(f"{url}/v1/tasks/{task_id}", headers=as_bob),
        httpx.get(f"{url}/v1/tasks/{unknown}", headers=as_bob),
        task_id,
        unknown,
    )
    before = q(svc, "SELECT * FROM task_status WHERE task_id = %s", task_id)
    same_404(
        httpx.post(f"{url}/v1/tasks/{task_id}/cancel", headers=as_bob),
        httpx.post(f"{url}/v1/tasks/{unknown}/cancel", headers=as_bob),
        task_id,
        unknown,
    )
    assert q(svc, "SELECT * FROM task_status WHERE task_id = %s", task_id) == before
    same_404(
        httpx.get(f"{url}/v1/dags/hello", headers=as_bob),
        httpx.get(f"{url}/v1/dags/nope", headers=as_bob),
        "hello",
        "nope",
    )
    assert httpx.get(f"{url}/v1/dags", headers=as_bob).json() == []
    # Ad-hoc tasks: org admins only, to create and to list.
    assert (
        httpx.post(
            f"{url}/v1/tasks", json={"job": "j", "operator": "noop"}, headers=as_bob
        ).status_code
        == 403
    )
    assert httpx.get(f"{url}/v1/tasks", headers=as_bob).status_code == 403

    # Reading a published dataset lists its DAG, but its spec, runs and tasks stay hidden.
    cp.set_read_roles(me, "hello_raw", ["analyst"], [])
    set_roles_of(svc, "bob", ["analyst"])
    listed = httpx.get(f"{url}/v1/dags", headers=as_bob).json()
    assert [(d["name"], d["can_deploy"]) for d in listed] == [("hello", False)]
    assert httpx.get(f"{url}/v1/dags/hello", headers=as_bob).status_code == 404
    assert httpx.get(f"{url}/v1/runs/{run_id}", headers=as_bob).status_code == 404

    # Whoever may deploy the DAG sees all of it, and may cancel its tasks.
    cp.set_deploy_roles(me, "hello", ["analyst"])
    assert [r["run_id"] for r in httpx.get(f"{url}/v1/runs", headers=as_bob).json()] == [run_id]
    assert httpx.get(f"{url}/v1/runs/{run_id}", headers=as_bob).status_code == 200
    assert httpx.get(f"{url}/v1/tasks/{task_id}", headers=as_bob).status_code == 200
    assert httpx.get(f"{url}/v1/dags/hello", headers=as_bob).json()["spec"]["name"] == "hello"
    r = httpx.post(f"{url}/v1/tasks/{task_id}/cancel", headers=as_bob)
    assert r.status_code == 200 and r.json()["status"] == "canceled"


def set_roles_of(svc: Services, name: str, roles: list[str]) -> None:
    with svc.pool.connection() as conn:
        set_roles(conn, admin(svc), name, roles, False)


def test_runs_and_tasks_of_another_org_are_404(secure: tuple[Services, str]) -> None:
    svc, url = secure
    cp, me = svc.control, admin(svc)
    cp.deploy(me, three_jobs())
    run = cp.trigger(me, "hello")
    run_id, task_id = str(run["run_id"]), str(run["tasks"][0])
    other = uuid.uuid4()
    with svc.pool.connection() as conn, conn.transaction():
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'other')", (other,))
        eve = ensure_user(conn, other, "eve", is_admin=True)
        as_eve = bearer(create_key(conn, eve.user_id))
    assert httpx.get(f"{url}/v1/runs", headers=as_eve).json() == []
    assert httpx.get(f"{url}/v1/runs/{run_id}", headers=as_eve).status_code == 404
    assert httpx.get(f"{url}/v1/tasks/{task_id}", headers=as_eve).status_code == 404
    assert httpx.post(f"{url}/v1/tasks/{task_id}/cancel", headers=as_eve).status_code == 404
    assert httpx.get(f"{url}/v1/dags/hello", headers=as_eve).status_code == 404
    assert str(task_id) not in httpx.get(f"{url}/v1/tasks", headers=as_eve).text
    # An admin's ad-hoc task cannot borrow a DAG's identity (its slots, secrets, datasets).
    dag_id = str(q(svc, "SELECT dag_id FROM dags")[0]["dag_id"])
    r = httpx.post(
        f"{url}/v1/tasks",
        json={"job": "j", "operator": "noop", "dag_id": dag_id, "worker_pool": "rpc"},
        headers=as_eve,
    )
    assert r.status_code == 422 and "dag_id, worker_pool" in r.json()["message"]
    # ...nor write to another org's dataset, nor choose where its outputs live.
    theirs = str(q(svc, "SELECT dataset_uuid FROM datasets LIMIT 1")[0]["dataset_uuid"])
    for output, why in (
        ({"dataset_uuid": theirs}, f"dataset {theirs} is not a dataset of your org"),
        ({"dataset_uuid": str(uuid.uuid4()), "location": "org/x/"}, "location are set by deploys"),
    ):
        r = httpx.post(
            f"{url}/v1/tasks",
            json={"job": "j", "operator": "noop", "outputs": [output]},
            headers=as_eve,
        )
        assert r.status_code == 422 and why in r.json()["message"], r.text
    assert count(svc, "task_registry") == 1  # only the admin's run's source task


def test_cli_task_commands_check_like_the_api(dsn: str, tmp_path: Path) -> None:
    env = {"TRACE_STATE_DSN": dsn, "TRACE_HOME": str(tmp_path)}
    created = cli(["task", "create", "--job", "cli", "--operator", "noop"], env)
    assert created.returncode == 0, created.stdout + created.stderr
    task_id = created.stdout.split("task ")[-1].split(" queued")[0]
    settings = Settings(state_dsn=dsn, home=tmp_path)
    svc = Services.build(settings, dsn)
    try:
        _, bob_key = user(svc, "bob")
    finally:
        svc.close()
    as_bob = {**env, "TRACE_API_KEY": bob_key}
    r = cli(["task", "create", "--job", "cli", "--operator", "noop"], as_bob)
    assert r.returncode == 1 and "only org admins may create ad-hoc tasks" in r.stdout
    r = cli(["task", "show", task_id], as_bob)
    assert r.returncode == 1 and f"task {task_id} does not exist" in r.stdout
    r = cli(["task", "cancel", task_id], as_bob)
    assert r.returncode == 1 and f"task {task_id} does not exist" in r.stdout
    r = cli(["task", "list"], as_bob)
    assert r.returncode == 1 and task_id not in r.stdout
    assert "queued" in cli(["task", "show", task_id], env).stdout  # untouched


# -- secrets ------------------------------------------------------------------------------------
def test_deploy_naming_anothers_secret_is_refused_until_granted_and_revoked_at_claim(
    services: Services,
) -> None:
    cp, d = services.control, services.dispatcher
    alice, _ = user(services, "alice")
    bob, _ = user(services, "bob")
    cp.set_secret(alice, "alice_token", "alice-secret-value")
    dag = POOLED.format(name="bobs", secret="alice_token")

    before = {t: count(services, t) for t in ("dags", "dag_versions", "pool_slots", "datasets")}
    with pytest.raises(Forbidden, match=r"'bob' may not use secret 'alice_token'"):
        cp.deploy(bob, dag)
    assert {t: count(services, t) for t in before} == before  # nothing stored
    # Nor may bob overwrite it or give himself a role on it.
    with pytest.raises(Forbidden, match="may not change secret 'alice_token'"):
        cp.set_secret(bob, "alice_token", "bobs-value", ["ops"])

    # Alice lets holders of `ops` use it; bob gets `ops`: his deploy passes, his task gets it.
    cp.set_secret(alice, "alice_token", "alice-secret-value", ["ops"])
    assert cp.set_secret(alice, "alice_token", "alice-secret-value")["use_roles"] == ["ops"]
    set_roles_of(services, "bob", ["ops"])
    bob = refreshed(services, bob)
    cp.deploy(bob, dag)
    (task_id,) = cp.trigger(bob, "bobs")["tasks"]
    c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
    ref = LeaseRef(task_id=task_id, attempt=c.attempt, lease_token=c.lease_token)
    assert d.secrets(ref) == {"TOKEN": "alice-secret-value"}

    # Revoked: the next task-secrets call refuses, naming the secret.
    set_roles_of(services, "bob", [])
    with pytest.raises(Forbidden, match=r"'bob' .* may no longer use secret 'alice_token'"):
        d.secrets(ref)
    # The owner and admins always may.
    cp.deploy(alice, POOLED.format(name="alices", secret="alice_token"))
    cp.deploy(admin(services), POOLED.format(name="admins", secret="alice_token"))


def test_secret_values_are_sealed_at_rest_and_never_listed(secure: tuple[Services, str]) -> None:
    svc, url = secure
    value = "pl41ntext-needle-" + uuid.uuid4().hex
    alice, alice_key = user(svc, "alice")
    _, bob_key = user(svc, "bob", roles=["ops"])
    _, carol_key = user(svc, "carol")
    r = httpx.put(
        f"{url}/v1/secrets/rpc_key",
        json={"value": value, "use_roles": ["ops"]},
        headers=bearer(alice_key),
    )
    assert r.status_code == 204, r.text

    with svc.pool.connection() as conn:
        raw = conn.execute("SELECT s::text AS row FROM secrets s").fetchone()
        cols = conn.execute("SELECT * FROM secrets").fetchone()
    assert raw is not None and cols is not None
    assert value not in raw["row"] and value.encode() not in raw["row"].encode()
    assert cols["legacy_value"] is None and cols["ciphertext"]
    assert cols["owner_user_id"] == alice.user_id and cols["use_roles"] == ["ops"]
    path = key_file(svc.settings)
    assert path.stat().st_mode & 0o777 == 0o600

    listed = {}
    for who, key in (("admin", admin_key(svc)), ("alice", alice_key), ("bob", bob_key)):
        resp = httpx.get(f"{url}/v1/secrets", headers=bearer(key))
        assert resp.status_code == 200 and value not in resp.text
        listed[who] = resp.json()
    for who in ("admin", "alice", "bob"):  # admins, the owner, holders of a use_role
        assert [(s["name"], s["owner"], s["use_roles"]) for s in listed[who]] == [
            ("rpc_key", "alice", ["ops"])
        ]
        assert set(listed[who][0]) == {"name", "owner", "use_roles", "updated_at"}
    assert httpx.get(f"{url}/v1/secrets", headers=bearer(carol_key)).json() == []

    # Names are checked before Postgres sees them: a clear 422 naming the rule.
    r = httpx.put(f"{url}/v1/secrets/bad name", json={"value": "v"}, headers=bearer(alice_key))
    assert r.status_code == 422 and r.json()["error"] == "invalid"
    assert "must match" in r.json()["message"] and "'bad name'" in r.json()["message"]
    with pytest.raises(Invalid, match="must match"):
        svc.control.set_secret(alice, "-dash", "v")
    r = httpx.put(
        f"{url}/v1/secrets/ok_name",
        json={"value": "v", "use_roles": ["Not A Role"]},
        headers=bearer(alice_key),
    )
    assert r.status_code == 422
    # A huge role list (under the body limit) is refused as a whole, before any role is checked.
    many = [f"r{i}" for i in range(100_000)]
    r = httpx.put(
        f"{url}/v1/secrets/ok_name",
        json={"value": "v", "use_roles": many},
        headers=bearer(alice_key),
        timeout=30,
    )
    assert r.status_code == 422 and "at most 100 roles" in r.json()["message"], r.text
    assert count(svc, "secrets") == 1


def test_cli_secrets_set_and_list_show_no_values(dsn: str, tmp_path: Path) -> None:
    env = {"TRACE_STATE_DSN": dsn, "TRACE_HOME": str(tmp_path)}
    value = "cli-needle-" + uuid.uuid4().hex
    r = cli(["secrets", "set", "rpc_key", "--use-role", "ops", "--use-role", "dev"], env, value)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "created" in r.stdout and "dev, ops" in r.stdout and value not in r.stdout
    listed = cli(["secrets", "list"], env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "rpc_key" in listed.stdout and "admin" in listed.stdout and "dev, ops" in listed.stdout
    assert value not in listed.stdout + listed.stderr
    bad = cli(["secrets", "set", "bad name"], env, "v")
    assert bad.returncode == 1 and "must match" in bad.stdout


# -- plaintext rows of an existing install ------------------------------------------------------
@pytest.fixture
def empty_db(pg_server: str) -> Iterator[str]:
    with empty_database(pg_server) as db:
        yield db


def test_plaintext_secrets_of_an_existing_install_are_sealed_at_start(
    empty_db: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    everything = mig.available()
    before = [x for x in everything if x.version < "0008"]
    monkeypatch.setattr(mig, "available", lambda: before)
    mig.migrate(empty_db)
    with psycopg.connect(empty_db) as conn:
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'lite')", (LITE_ORG_ID,))
        admin_id = uuid.uuid4()
        conn.execute(
            "INSERT INTO users (user_id, org_id, name, is_admin) VALUES (%s, %s, 'admin', true)",
            (admin_id, LITE_ORG_ID),
        )
        conn.execute(
            "INSERT INTO secrets (org_id, name, value) VALUES (%s, 'old_key', 'old-plaintext')",
            (LITE_ORG_ID,),
        )
    monkeypatch.setattr(mig, "available", lambda: everything)
    mig.migrate(empty_db)
    with psycopg.connect(empty_db) as conn:
        row = conn.execute("SELECT legacy_value, ciphertext, owner_user_id FROM secrets").fetchone()
    assert row == ("old-plaintext", None, admin_id)  # the migration loses nothing

    svc = Services.build(settings, empty_db)
    try:
        (sealed,) = q(svc, "SELECT s::text AS row, legacy_value, ciphertext FROM secrets s")
        assert sealed["legacy_value"] is None and sealed["ciphertext"]
        assert "old-plaintext" not in sealed["row"]
        me = admin(svc)
        assert [s["owner"] for s in svc.control.list_secrets(me)] == ["admin"]
        svc.control.deploy(me, POOLED.format(name="old", secret="old_key"))
        (task_id,) = svc.control.trigger(me, "old")["tasks"]
        d = svc.dispatcher
        c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
        ref = LeaseRef(task_id=task_id, attempt=c.attempt, lease_token=c.lease_token)
        assert d.secrets(ref) == {"TOKEN": "old-plaintext"}
    finally:
        svc.close()


def test_an_admin_overwrite_takes_back_a_name_a_user_claimed_first(services: Services) -> None:
    """A no-role user may create any unused secret name; if an admin then writes that name the
    admin owns it, so the first user can no longer change what the admin's pipelines get."""
    cp, me = services.control, admin(services)
    mallory, _ = user(services, "mallory")
    cp.set_secret(mallory, "rpc_url", "http://mallory.example/")
    cp.set_secret(me, "rpc_url", "http://node.example/")
    with pytest.raises(Forbidden, match="may not change secret 'rpc_url'"):
        cp.set_secret(mallory, "rpc_url", "http://mallory.example/again")
    (listed,) = [s for s in cp.list_secrets(me) if s["name"] == "rpc_url"]
    assert listed["owner"] == me.name
    assert cp.list_secrets(mallory) == []  # no longer hers, and not shared with her


PRODUCER = """
name: alices
jobs:
  p: {operator: noop, outputs: [{backend: parquet}]}
publish:
  - {job: p, output_index: 0, dataset: alice_data}
"""
CONSUMER = (
    "name: bobs_reader\njobs:\n  c: {operator: noop, inputs: [{from: {dataset: alice_data}}]}"
)


def alice_and_her_reader(services: Services) -> Callable[[], uuid.UUID]:
    """alice's producer and bob's consumer of alice_data (bob an analyst, allowed to read it);
    the call it answers runs alice's job once and gives the task that made for bob's job."""
    from trace_platform.contract import CompleteRequest, EventIn

    cp, d = services.control, services.dispatcher
    alice, _ = user(services, "alice")
    bob, _ = user(services, "bob", roles=["analyst"])
    cp.deploy(alice, PRODUCER)
    cp.set_read_roles(admin(services), "alice_data", ["analyst"], [])
    cp.deploy(bob, CONSUMER)
    data = q(services, "SELECT dataset_uuid FROM datasets WHERE dataset_name = 'alice_data'")[0]

    def produce() -> uuid.UUID:
        (task_id,) = cp.trigger(alice, "alices")["tasks"]
        c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
        res = d.complete(
            CompleteRequest(
                task_id=task_id,
                attempt=c.attempt,
                lease_token=c.lease_token,
                outcome="succeeded",
                final_events=[EventIn(dataset_uuid=data["dataset_uuid"], cursor=str(task_id))],
            )
        )
        assert res.status == "succeeded"
        (reader,) = q(
            services,
            "SELECT task_id FROM task_registry WHERE job = 'c' AND parent_task_id = %s",
            task_id,
        )
        return uuid.UUID(str(reader["task_id"]))

    return produce


def test_a_revoked_read_stops_a_consumer_deployed_while_it_was_allowed(
    services: Services,
) -> None:
    """Read access is the deployer's as it is now: checked where a consumer's task is made and
    where it is claimed, not only at deploy. A revoked reader's task fails naming the dataset."""
    d = services.dispatcher
    produce = alice_and_her_reader(services)

    def state(task_id: uuid.UUID) -> tuple[str, str | None]:
        view = d.get_task(task_id)
        return view.status, view.last_error

    # Allowed: bob's task is made queued and runs.
    allowed = produce()
    assert state(allowed) == ("queued", None)
    assert d.claim(ClaimRequest(task_id=allowed, worker_id="w")).attempt == 1

    # A task made while allowed, claimed after the revocation: refused at claim, failed.
    queued = produce()
    set_roles_of(services, "bob", [])
    with pytest.raises(Forbidden, match=r"'bob' .* may no longer read dataset 'alice_data'"):
        d.claim(ClaimRequest(task_id=queued, worker_id="w"))
    status, error = state(queued)
    assert status == "failed" and "may no longer read dataset 'alice_data'" in (error or "")
    assert d.get_task(queued).attempts == []  # it never ran

    # Made after the revocation: failed where it is made, with the same reason.
    later = produce()
    status, error = state(later)
    assert status == "failed" and "403 forbidden: 'bob'" in (error or "")

    # Granted again (or read by an admin's deploy): runs again.
    set_roles_of(services, "bob", ["analyst"])
    assert state(produce())[0] == "queued"
