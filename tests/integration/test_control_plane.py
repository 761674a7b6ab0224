"""Deploys, events to tasks, triggers, cron, permissions: against a real Postgres."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.support.dags import admin, three_jobs, user
from tests.support.invariants import expire_lease
from trace_platform.contract import (
    ClaimRequest,
    CompleteRequest,
    CompleteResponse,
    EventIn,
    EventsRequest,
    LeaseRef,
    OutputCommit,
    RangeSpec,
    TaskSpec,
)
from trace_platform.errors import Conflict
from trace_platform.identity import Forbidden
from trace_platform.services import Services
from trace_platform.triggers.cron import tick


def q(services: Services, sql: str, *args: Any) -> list[dict[str, Any]]:
    with services.pool.connection() as conn:
        return conn.execute(sql, args).fetchall()


def run_task(
    services: Services, task_id: uuid.UUID, outcome: str = "succeeded", **kw: Any
) -> CompleteResponse:
    d = services.dispatcher
    c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
    return d.complete(
        CompleteRequest(
            task_id=task_id, attempt=c.attempt, lease_token=c.lease_token, outcome=outcome, **kw
        )
    )


def test_deploy_registers_versions_and_publishes(services: Services) -> None:
    cp, me = services.control, admin(services)
    res = cp.deploy(me, three_jobs())
    assert (res.version, res.created) == (1, True)
    assert set(res.datasets) == {"hello_raw", "hello_clean"}
    rows = q(services, "SELECT dataset_name, location FROM datasets ORDER BY producer_job")
    assert all(str(r["location"]).startswith(f"org/{me.org_id}/dataset/") for r in rows)
    assert "hello" not in "".join(r["location"] for r in rows)  # physical names use only UUIDs
    first = {
        r["dataset_uuid"]: r["dataset_version"]
        for r in q(services, "SELECT * FROM dataset_current")
    }
    # Execution-only edit (timeout): same versions. Materialization edit to transform: transform
    # and everything downstream get new versions; source keeps its own.
    res2 = cp.deploy(
        me, three_jobs().replace("  transform:\n", "  transform:\n    timeout_seconds: 99\n")
    )
    assert res2.version == 2 and res2.rebuilt_jobs == []
    assert {
        r["dataset_uuid"]: r["dataset_version"]
        for r in q(services, "SELECT * FROM dataset_current")
    } == first
    res3 = cp.deploy(
        me, three_jobs().replace("config: {count: 1, final: 1}", "config: {count: 2, final: 1}")
    )
    assert res3.rebuilt_jobs == ["sink", "transform"] and not res3.live
    # Built beside the live version: nothing served moves until the cutover.
    assert {
        r["dataset_uuid"]: r["dataset_version"]
        for r in q(services, "SELECT * FROM dataset_current")
    } == first
    assert cp.show_dag(me, "hello")["active_version"] == 2
    (done,) = cp.changes.auto_cutover()  # nothing to replay: complete at once
    assert (done["version"], done["previous"]) == (3, 2)
    now = {
        r["dataset_uuid"]: r["dataset_version"]
        for r in q(services, "SELECT * FROM dataset_current")
    }
    raw, clean = res.datasets["hello_raw"], res.datasets["hello_clean"]
    assert now[raw] == first[raw] and now[clean] != first[clean]
    assert cp.show_dag(me, "hello")["active_version"] == 3
    assert cp.show_dataset(me, "hello_clean")["current_version"] == now[clean]


def test_events_become_tasks_once_with_parent_links(services: Services) -> None:
    cp, me, d = services.control, admin(services), services.dispatcher
    cp.deploy(me, three_jobs())
    fired = cp.trigger(me, "hello")
    (source_id,) = fired["tasks"]
    c = d.claim(ClaimRequest(task_id=source_id, worker_id="w"))
    payload = d.fetch(LeaseRef(task_id=source_id, attempt=c.attempt, lease_token=c.lease_token))
    out = payload.outputs[0]
    assert payload.run_id == fired["run_id"] and out.dataset_version is not None
    ev = EventIn(dataset_uuid=out.dataset_uuid, cursor="1")
    lease = {"task_id": source_id, "attempt": c.attempt, "lease_token": c.lease_token}
    first = d.events(EventsRequest(**lease, events=[ev]))
    again = d.events(EventsRequest(**lease, events=[ev]))  # the same event delivered twice
    assert (first.tasks_created, again.tasks_created, again.duplicates) == (1, 0, 1)
    # An event for a dataset the task does not produce is refused.
    with pytest.raises(Forbidden, match="does not produce"):
        d.events(EventsRequest(**lease, events=[EventIn(dataset_uuid=uuid.uuid4(), cursor="x")]))
    done = d.complete(
        CompleteRequest(
            **lease,
            outcome="succeeded",
            final_events=[EventIn(dataset_uuid=out.dataset_uuid, cursor="2")],
            outputs=[
                OutputCommit(
                    dataset_uuid=out.dataset_uuid, range=RangeSpec(start=1, end=2), row_count=10
                )
            ],
        )
    )
    assert (done.tasks_created, done.outputs_committed) == (1, 1)
    tree = cp.show_run(me, fired["run_id"])["tasks"]
    transforms = [t for t in tree if t["job"] == "transform"]
    assert len(transforms) == 2 and all(t["parent_task_id"] == source_id for t in transforms)
    view = d.get_task(transforms[0]["task_id"])
    assert view.run_id == fired["run_id"] and view.parent_task_id == source_id
    commits = q(services, "SELECT dataset_version, scope, row_count FROM dataset_commits")
    assert commits == [
        {"dataset_version": out.dataset_version, "scope": "range:1-2", "row_count": 10}
    ]
    assert cp.show_dataset(me, "hello_raw")["row_count"] == 10


def test_stale_attempt_events_and_outputs_are_rejected(services: Services) -> None:
    cp, me, d = services.control, admin(services), services.dispatcher
    cp.deploy(me, three_jobs())
    (tid,) = cp.trigger(me, "hello")["tasks"]
    c1 = d.claim(ClaimRequest(task_id=tid, worker_id="w"))
    out = d.fetch(LeaseRef(task_id=tid, attempt=1, lease_token=c1.lease_token)).outputs[0]
    with services.pool.connection() as conn:
        conn.execute("UPDATE task_status SET lease_until = now() - interval '1 s'")
    d.reap()
    with services.pool.connection() as conn:
        conn.execute("UPDATE task_status SET next_attempt_at = now()")
    d.claim(ClaimRequest(task_id=tid, worker_id="w2"))
    stale = {"task_id": tid, "attempt": 1, "lease_token": c1.lease_token}
    with pytest.raises(Conflict, match="stale"):
        d.events(
            EventsRequest(**stale, events=[EventIn(dataset_uuid=out.dataset_uuid, cursor="1")])
        )
    with pytest.raises(Conflict, match="stale"):
        d.complete(
            CompleteRequest(
                **stale,
                outcome="succeeded",
                outputs=[OutputCommit(dataset_uuid=out.dataset_uuid, row_count=1)],
            )
        )
    assert q(services, "SELECT count(*) AS n FROM dataset_commits")[0]["n"] == 0
    assert (
        q(services, "SELECT count(*) AS n FROM task_registry WHERE job = 'transform'")[0]["n"] == 0
    )


def test_cron_fires_each_tick_once_with_two_schedulers(services: Services) -> None:
    cp, me = services.control, admin(services)
    cp.deploy(me, three_jobs())
    now = datetime.now(UTC) + timedelta(seconds=61)
    fired: list[int] = []
    threads = [
        threading.Thread(target=lambda: fired.append(tick(services.dispatcher, now)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(fired) == 1
    assert tick(services.dispatcher, now) == 0  # a restarted scheduler does not fire it again
    runs = cp.list_runs(me)
    assert len(runs) == 1 and runs[0]["kind"] == "cron" and runs[0]["tasks"] == 1
    # Catch-up after 10 minutes of downtime: one run, for the latest tick, the rest counted.
    later = now + timedelta(minutes=10)
    assert tick(services.dispatcher, later) == 1
    latest = q(services, "SELECT config FROM trigger_fires ORDER BY created_at DESC LIMIT 1")[0][
        "config"
    ]
    assert latest["skipped_ticks"] >= 9
    assert latest["scheduled_for"].startswith(later.strftime("%Y-%m-%dT%H:%M"))


def test_pool_slots_bound_concurrency_and_free_on_every_path(services: Services) -> None:
    cp, me, d = services.control, admin(services), services.dispatcher
    text = (
        "name: pooled\nworker_pools: {rpc: [{env: {N: '0'}}, {env: {N: '1'}}]}\n"
        "jobs:\n  a: {operator: noop, worker_pool: rpc, scaling: {max_concurrency: 5}, max_attempts: 2}"
    )
    cp.deploy(me, text)
    ids = [cp.trigger(me, "pooled")["tasks"][0] for _ in range(5)]
    claims = []
    for t in ids:
        try:
            claims.append(d.claim(ClaimRequest(task_id=t, worker_id="w")))
        except Conflict as e:
            assert e.code == "waiting_for_slot"
    assert len(claims) == 2 and {c.slot.slot_index for c in claims if c.slot} == {0, 1}
    services.publisher.drain()
    while services.driver.receive("tasks", 100, 30):  # drop the initial wake-ups
        pass
    # Success frees a slot and wakes a waiting task (no polling).
    c0 = claims[0]
    d.complete(
        CompleteRequest(
            task_id=c0.task_id, attempt=1, lease_token=c0.lease_token, outcome="succeeded"
        )
    )
    services.publisher.drain()
    woken = [x.payload["task_id"] for x in services.driver.receive("tasks", 10, 30)]
    assert woken and all(uuid.UUID(w) in ids[2:] for w in woken)
    # A reaped lease frees its slot too.
    expire_lease(services, claims[1].task_id)
    d.reap()
    assert (
        q(services, "SELECT count(*) AS n FROM pool_slots WHERE leased_by_task IS NOT NULL")[0]["n"]
        == 0
    )
    # max_concurrency below the pool size is the tighter bound.
    cp.deploy(me, text.replace("max_concurrency: 5", "max_concurrency: 1"))
    extra = [cp.trigger(me, "pooled")["tasks"][0] for _ in range(2)]
    d.claim(ClaimRequest(task_id=extra[0], worker_id="w"))
    with pytest.raises(Conflict, match="max_concurrency"):
        d.claim(ClaimRequest(task_id=extra[1], worker_id="w"))


@pytest.mark.parametrize(
    ("outcome", "retryable"),
    [("failed", False), ("failed", True), ("canceled", True), ("released", True)],
)
def test_every_ending_of_an_attempt_frees_its_slot(
    services: Services, outcome: str, retryable: bool
) -> None:
    cp, me, d = services.control, admin(services), services.dispatcher
    cp.deploy(
        me,
        "name: slots\nworker_pools: {rpc: [{}]}\n"
        "jobs:\n  a: {operator: noop, worker_pool: rpc, max_attempts: 3}",
    )
    (task,) = cp.trigger(me, "slots")["tasks"]
    (other,) = cp.trigger(me, "slots")["tasks"]
    c = d.claim(ClaimRequest(task_id=task, worker_id="w"))
    with pytest.raises(Conflict, match="every slot"):
        d.claim(ClaimRequest(task_id=other, worker_id="w"))
    d.complete(
        CompleteRequest(
            task_id=task,
            attempt=c.attempt,
            lease_token=c.lease_token,
            outcome=outcome,  # type: ignore[arg-type]
            retryable=retryable,
            error="x",
        )
    )
    held = "SELECT count(*) AS n FROM pool_slots WHERE leased_by_task IS NOT NULL"
    assert q(services, held)[0]["n"] == 0
    assert d.claim(ClaimRequest(task_id=other, worker_id="w")).slot is not None


def test_a_freed_slot_wakes_a_task_that_can_take_it(services: Services) -> None:
    """Job a (max_concurrency 1) has the oldest waiting tasks, job b the next ones: when b's
    running task frees a slot, a's tasks cannot take it (a is at its limit), so b's is woken,
    and only as many as there are free slots."""
    cp, me, d = services.control, admin(services), services.dispatcher
    cp.deploy(
        me,
        "name: shared_pool\nworker_pools: {rpc: [{}, {}]}\njobs:\n"
        "  a: {operator: noop, worker_pool: rpc, scaling: {max_concurrency: 1}}\n"
        "  b: {operator: noop, worker_pool: rpc, scaling: {max_concurrency: 2}}",
    )
    by_job: dict[str, list[uuid.UUID]] = {"a": [], "b": []}
    for _ in range(3):
        for t in cp.trigger(me, "shared_pool")["tasks"]:
            job = q(services, "SELECT job FROM task_registry WHERE task_id = %s", t)[0]["job"]
            by_job[job].append(t)
    a1, b1 = (d.claim(ClaimRequest(task_id=by_job[j][0], worker_id="w")) for j in ("a", "b"))
    with services.pool.connection() as conn:  # b's waiting tasks queued after all of a's
        conn.execute(
            "UPDATE task_status SET updated_at = now() + interval '1 minute' "
            "WHERE task_id = ANY(%s)",
            [by_job["b"][1:]],
        )
    services.publisher.drain()
    while services.driver.receive("tasks", 100, 30):  # drop the initial wake-ups
        pass
    d.complete(
        CompleteRequest(
            task_id=b1.task_id, attempt=1, lease_token=b1.lease_token, outcome="succeeded"
        )
    )
    services.publisher.drain()
    woken = [uuid.UUID(x.payload["task_id"]) for x in services.driver.receive("tasks", 10, 30)]
    assert woken == [by_job["b"][1]]
    assert d.claim(ClaimRequest(task_id=woken[0], worker_id="w")).slot is not None
    assert a1.slot is not None


def test_manual_trigger_idempotency_key(services: Services) -> None:
    cp, me = services.control, admin(services)
    cp.deploy(me, three_jobs())
    a = cp.trigger(me, "hello", fire_key="k1")
    b = cp.trigger(me, "hello", fire_key="k1")
    assert a["run_id"] == b["run_id"] and b["tasks"] == [] and len(a["tasks"]) == 1


# -- permissions over HTTP ------------------------------------------------------------------


def test_permissions_and_clear_401_403(secure: tuple[Services, str]) -> None:
    svc, url = secure
    admin_key = svc.new_admin_key or (svc.settings.home / "admin.key").read_text().strip()
    svc.control.deploy(admin(svc), three_jobs())
    _, bob_key = user(svc, "bob", roles=["analyst"])
    as_admin = {"Authorization": f"Bearer {admin_key}"}
    as_bob = {"Authorization": f"Bearer {bob_key}"}

    assert httpx.get(f"{url}/v1/dags").status_code == 401
    r = httpx.get(f"{url}/v1/dags", headers={"Authorization": "Bearer trc_nope"})
    assert r.status_code == 401 and "unknown" in r.json()["message"]

    r = httpx.post(f"{url}/v1/dags", json={"yaml": three_jobs()}, headers=as_bob)
    assert r.status_code == 403 and "may not deploy DAG 'hello'" in r.json()["message"]
    r = httpx.post(f"{url}/v1/dags/hello/trigger", headers=as_bob)
    assert r.status_code == 403 and "may not trigger" in r.json()["message"]
    r = httpx.post(f"{url}/v1/hooks/hello/poke", json={}, headers=as_bob)
    assert r.status_code == 403

    # Empty read_roles: private to the producing DAG's deployers and admins.
    assert "hello_raw" in {
        d["dataset_name"] for d in httpx.get(f"{url}/v1/datasets", headers=as_admin).json()
    }
    assert httpx.get(f"{url}/v1/datasets", headers=as_bob).json() == []
    assert httpx.get(f"{url}/v1/datasets/hello_raw", headers=as_bob).status_code == 404
    reader = "name: bobs\njobs:\n  a: {operator: noop, inputs: [{from: {dataset: hello_raw}}]}"
    r = httpx.post(f"{url}/v1/dags", json={"yaml": reader}, headers=as_bob)
    # Unreadable answers as unknown (test_private_datasets.py): no 403 tells them apart.
    assert r.status_code == 422 and "unknown dataset 'hello_raw'" in r.json()["message"]
    # Only admins manage read_roles; granting the role makes it visible and readable.
    r = httpx.post(
        f"{url}/v1/datasets/hello_raw/read-roles", json={"add": ["analyst"]}, headers=as_bob
    )
    assert r.status_code == 403
    r = httpx.post(
        f"{url}/v1/datasets/hello_raw/read-roles", json={"add": ["analyst"]}, headers=as_admin
    )
    assert r.json() == {"read_roles": ["analyst"]}
    assert [d["dataset_name"] for d in httpx.get(f"{url}/v1/datasets", headers=as_bob).json()] == [
        "hello_raw"
    ]
    r = httpx.post(f"{url}/v1/dags", json={"yaml": reader}, headers=as_bob)
    assert r.status_code == 201, r.text

    # Webhook as the admin: durable intent, config merged, idempotency key honoured.
    hook = {**as_admin, "Idempotency-Key": "delivery-1"}
    r1 = httpx.post(f"{url}/v1/hooks/hello/poke", json={"x": 1}, headers=hook)
    r2 = httpx.post(f"{url}/v1/hooks/hello/poke", json={"x": 1}, headers=hook)
    assert (
        r1.status_code == 201
        and r1.json()["run_id"] == r2.json()["run_id"]
        and r2.json()["tasks"] == []
    )
    (task_id,) = r1.json()["tasks"]
    event = svc.dispatcher.get_task(uuid.UUID(task_id))
    assert event.run_id is not None
    fire = q(svc, "SELECT kind, config FROM trigger_fires WHERE run_id = %s", event.run_id)[0]
    assert fire == {"kind": "webhook", "config": {"from_hook": True, "x": 1}}
    assert httpx.post(f"{url}/v1/hooks/hello/nope", json={}, headers=as_admin).status_code == 404
    # Bob's task views of a DAG he cannot deploy answer like unknown tasks.
    assert httpx.get(f"{url}/v1/tasks/{task_id}", headers=as_bob).status_code == 404


def test_deploy_roles_grant_trigger(services: Services) -> None:
    cp = services.control
    cp.deploy(admin(services), three_jobs())
    carol, _ = user(services, "carol", roles=["ops"])
    with pytest.raises(Forbidden):
        cp.trigger(carol, "hello")
    with pytest.raises(Forbidden):
        cp.set_deploy_roles(carol, "hello", ["ops"])
    cp.set_deploy_roles(admin(services), "hello", ["ops"])
    assert cp.trigger(carol, "hello")["tasks"]
    # Any user may create a secret (and owns it); only its owner or an admin may change it.
    cp.set_secret(admin(services), "k", "v")
    with pytest.raises(Forbidden):
        cp.set_secret(carol, "k", "v2")


def test_secret_values_never_listed(services: Services) -> None:
    cp, me = services.control, admin(services)
    cp.set_secret(me, "rpc_key", "hunter2")
    assert [s["name"] for s in cp.list_secrets(me)] == ["rpc_key"]
    assert "hunter2" not in repr(cp.list_secrets(me))


def test_a_big_runs_cancel_commits_batch_by_batch(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backfill's thousands of tasks were canceled one transaction each (5,000: 7 s here,
    a commit each); now in batches of up to 500, each one transaction."""
    me = admin(services)
    services.control.deploy(me, three_jobs("big"))
    run_id = uuid.UUID(str(services.control.trigger(me, "big")["run_id"]))
    dag_id = services.control.show_dag(me, "big")["dag_id"]
    extra = TaskSpec(job="extra", operator="noop", run_id=run_id, dag_id=dag_id, dag_version=1)
    services.dispatcher.create_tasks([(extra, "queued")] * 1_100)
    batches: list[int] = []
    cancel_many = services.dispatcher.cancel_many

    def counted(task_ids: list[uuid.UUID]) -> Any:
        batches.append(len(task_ids))
        return cancel_many(task_ids)

    monkeypatch.setattr(services.dispatcher, "cancel_many", counted)
    assert services.control.cancel_run(me, run_id)["canceled"] == 1_101  # and the run's root
    assert batches == [500, 500, 101]
    tree = services.control.show_run(me, run_id)["tasks"]
    assert len(tree) == 1_101 and {t["status"] for t in tree} == {"canceled"}
