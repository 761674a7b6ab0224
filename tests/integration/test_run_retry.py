"""Retrying a run's failed tasks (issue 43's "retry"), on a real Postgres, tasks driven by hand:
a task that failed its last try is queued again with a fresh budget of tries, claimed as the
next attempt, and its old attempts' reports land nothing; what it starts once it succeeds
follows; a run with nothing failed says so; a paused DAG or a superseded version is refused;
the API, the CLI and the console offer it to whoever may cancel the run, and no one else."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from tests.support.cli import trace
from tests.support.console import console, csrf_of, post
from tests.support.dags import admin, user
from tests.support.safe_change import claimable, finish, q, start
from tests.support.servers import admin_key, bearer
from trace_platform.contract import ClaimRequest, CompleteRequest, LeaseRef
from trace_platform.errors import Conflict
from trace_platform.identity import create_key, ensure_user
from trace_platform.services import Services

FLAKY = """
name: flaky
jobs:
  src:
    operator: noop
    max_attempts: {tries}
    outputs: [{{backend: parquet}}]
  down:
    operator: noop
    inputs: [{{job: src}}]
    outputs: [{{backend: parquet}}]
"""


def _fired(svc: Services, tries: int = 2) -> tuple[uuid.UUID, uuid.UUID]:
    """`flaky` deployed and triggered: (run id, its source task)."""
    svc.control.deploy(admin(svc), FLAKY.format(tries=tries))
    run = svc.control.trigger(admin(svc), "flaky", config={"ranges": [[0, 9]]})
    (task_id,) = run["tasks"]
    return run["run_id"], task_id


def _claim(svc: Services, task_id: uuid.UUID) -> tuple[LeaseRef, Any]:
    """The task's next attempt, claimed once its backoff (a fraction of a second in tests)
    has passed: waits on the claim being granted, not on a clock."""
    deadline = time.monotonic() + 30
    while True:
        try:
            c = svc.dispatcher.claim(ClaimRequest(task_id=task_id, worker_id="w"))
        except Conflict as e:
            if "backing off" not in e.message or time.monotonic() > deadline:
                raise
            continue
        ref = LeaseRef(task_id=task_id, attempt=c.attempt, lease_token=c.lease_token)
        return ref, svc.dispatcher.fetch(ref)


def _fail(svc: Services, ref: LeaseRef) -> str:
    req = CompleteRequest(**ref.model_dump(), outcome="failed", error="boom")
    return svc.dispatcher.complete(req).status


def _failed_for_good(svc: Services, task_id: uuid.UUID, tries: int) -> LeaseRef:
    """Fails each of the task's tries; returns the last one's lease."""
    for n in range(1, tries + 1):
        ref, _ = _claim(svc, task_id)
        assert ref.attempt == n
        assert _fail(svc, ref) == ("failed" if n == tries else "queued")
    return ref


def _status(svc: Services, task_id: uuid.UUID) -> dict[str, Any]:
    (row,) = q(svc, "SELECT status, attempt FROM task_status WHERE task_id = %s", task_id)
    return row


def _audit(svc: Services, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return q(
        svc,
        "SELECT outcome, details, dag FROM audit_log WHERE action = 'run.retry' AND target = %s "
        "ORDER BY id",
        str(run_id),
    )


def test_a_failed_task_is_retried_with_a_fresh_budget_and_its_old_attempts_land_nothing(
    services: Services,
) -> None:
    svc, me = services, admin(services)
    run_id, src = _fired(svc, tries=2)
    last = _failed_for_good(svc, src, 2)

    res = svc.control.retry_run(me, run_id)
    assert res["retried"] == 1 and res["tasks"] == [src], res
    assert _status(svc, src) == {"status": "queued", "attempt": 2}
    (row,) = _audit(svc, run_id)
    assert row["outcome"] == "ok" and row["dag"] == "flaky"
    assert row["details"]["retried"] == 1
    assert row["details"]["tasks"] == [{"task_id": str(src), "job": "src", "after": 2}]
    # The outbox holds its wake-up, as a reaper's retry leaves one.
    woken = q(svc, "SELECT 1 FROM outbox WHERE payload::text LIKE %s", f"%{src}%")
    assert woken

    # The last attempt's late success lands nothing, before the next claim and after it.
    late = CompleteRequest(**last.model_dump(), outcome="succeeded")
    with pytest.raises(Conflict) as before_claim:
        svc.dispatcher.complete(late)
    assert before_claim.value.code == "wrong_lease"
    third, _ = _claim(svc, src)
    assert third.attempt == 3
    with pytest.raises(Conflict) as after_claim:
        svc.dispatcher.complete(late)
    assert after_claim.value.code == "stale_attempt"
    assert _status(svc, src) == {"status": "running", "attempt": 3}

    # A fresh budget of 2 tries: the first failure after the retry is retried again.
    assert _fail(svc, third) == "queued"
    fourth, payload = _claim(svc, src)
    assert fourth.attempt == 4
    assert finish(svc, fourth, payload) == "succeeded"
    # What it starts follows: the downstream task, made from its event, in the same run.
    tasks = svc.control.show_run(me, run_id)["tasks"]
    assert sorted((t["job"], t["status"]) for t in tasks) == [
        ("down", "queued"),
        ("src", "succeeded"),
    ]

    # Nothing failed any more: nothing to retry, said so (and logged as a no-op).
    again = svc.control.retry_run(me, run_id)
    assert again["retried"] == 0 and "nothing to retry" in again["message"]
    assert [r["outcome"] for r in _audit(svc, run_id)] == ["ok", "noop"]


TWO_SOURCES = """
name: twin
jobs:
  left: {operator: noop, max_attempts: 1, outputs: [{backend: parquet}]}
  right: {operator: noop, max_attempts: 1, outputs: [{backend: parquet}]}
"""


def test_a_runs_failed_tasks_are_requeued_and_woken_each_by_one_statement(
    services: Services,
) -> None:
    """Whatever their number: the retry's outbox rows were written by one INSERT (they share
    one command id, cmin: each statement of a transaction has its own), as were its
    task_retries rows."""
    svc, me = services, admin(services)
    svc.control.deploy(me, TWO_SOURCES)
    run = svc.control.trigger(me, "twin", config={"ranges": [[0, 9]]})
    assert len(run["tasks"]) == 2
    for task_id in run["tasks"]:
        _failed_for_good(svc, task_id, 1)
    res = svc.control.retry_run(me, run["run_id"])
    assert sorted(res["tasks"]) == sorted(run["tasks"]), res
    # The retry's transaction: the one that wrote its task_retries rows.
    (tx,) = q(
        svc,
        "SELECT DISTINCT xmin::text AS xid, cmin::text AS cmin FROM task_retries "
        "WHERE task_id = ANY(%s)",
        run["tasks"],
    )
    woken = q(
        svc,
        "SELECT (payload ->> 'task_id')::uuid AS task_id, cmin::text AS cmin FROM outbox "
        "WHERE xmin::text = %s",
        tx["xid"],
    )
    assert sorted(w["task_id"] for w in woken) == sorted(run["tasks"])
    assert len({w["cmin"] for w in woken}) == 1, woken


def test_the_fresh_budget_runs_out_like_the_first(services: Services) -> None:
    svc, me = services, admin(services)
    run_id, src = _fired(svc, tries=1)
    _failed_for_good(svc, src, 1)
    assert svc.control.retry_run(me, run_id)["retried"] == 1
    ref, _ = _claim(svc, src)
    assert ref.attempt == 2 and _fail(svc, ref) == "failed"  # one try again, and no more
    assert svc.control.retry_run(me, run_id)["retried"] == 1  # and retried again by hand
    assert _claim(svc, src)[0].attempt == 3


def test_canceled_tasks_stay_canceled(services: Services) -> None:
    svc, me = services, admin(services)
    run_id, src = _fired(svc)
    svc.control.cancel_run(me, run_id)
    res = svc.control.retry_run(me, run_id)
    assert res["retried"] == 0 and _status(svc, src)["status"] == "canceled"


def test_a_paused_dag_or_a_superseded_version_is_refused(services: Services) -> None:
    svc, me = services, admin(services)
    run_id, src = _fired(svc, tries=1)
    _failed_for_good(svc, src, 1)
    svc.control.changes.set_paused(me, "flaky", True)
    with pytest.raises(Conflict, match="is paused") as paused:
        svc.control.retry_run(me, run_id)
    assert paused.value.code == "dag_paused"
    svc.control.changes.set_paused(me, "flaky", False)
    # Version 2 (a new job) deployed and cut over: the run's version 1 is retired, its tasks
    # not retried (while version 2 was only rebuilding, version 1 was still the live one).
    svc.control.deploy(me, FLAKY.format(tries=1) + "  more: {operator: noop}\n")
    for task_id in claimable(svc):  # the rebuild's tasks
        assert finish(svc, *start(svc, task_id)) == "succeeded"
    svc.control.changes.cutover(me, "flaky")
    live = q(svc, "SELECT active_version FROM dags WHERE name = 'flaky'")[0]["active_version"]
    assert live == 2
    with pytest.raises(Conflict, match="version 1, which is retired") as old:
        svc.control.retry_run(me, run_id)
    assert old.value.code == "version_not_live"
    assert _status(svc, src)["status"] == "failed" and _audit(svc, run_id) == []


def test_http_and_cli_retry_for_those_who_may_cancel_only(secure: tuple[Services, str]) -> None:
    svc, url = secure
    run_id, src = _fired(svc, tries=1)
    _failed_for_good(svc, src, 1)
    _, bob_key = user(svc, "bob")  # no role
    other = uuid.uuid4()
    with svc.pool.connection() as conn, conn.transaction():
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'other')", (other,))
        eve_key = create_key(conn, ensure_user(conn, other, "eve", is_admin=True).user_id)
    for key in (bob_key, eve_key):
        cancel = httpx.post(f"{url}/v1/runs/{run_id}/cancel", headers=bearer(key))
        retry = httpx.post(f"{url}/v1/runs/{run_id}/retry", headers=bearer(key))
        assert retry.status_code == cancel.status_code == 404, retry.text
    assert _status(svc, src)["status"] == "failed" and _audit(svc, run_id) == []

    r = httpx.post(f"{url}/v1/runs/{run_id}/retry", headers=bearer(admin_key(svc)))
    assert r.status_code == 200 and r.json()["retried"] == 1, r.text
    ref, _ = _claim(svc, src)
    _fail(svc, ref)
    env = {"TRACE_STATE_DSN": svc.dsn, "TRACE_HOME": str(svc.settings.home)}
    out = trace(["runs", "retry", str(run_id)], env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 failed task(s) queued again" in out.stdout
    out = trace(["runs", "retry", str(run_id)], env)
    assert out.returncode == 0 and "nothing to retry" in out.stdout, out.stdout + out.stderr


def test_the_console_offers_retry_only_for_failed_tasks_and_wants_its_token(
    secure: tuple[Services, str],
) -> None:
    svc, url = secure
    run_id, src = _fired(svc, tries=1)
    with console(url, admin_key(svc)) as c:
        page = c.get(f"/console/runs/{run_id}")
        assert page.status_code == 200 and "Cancel" in page.text
        assert "Retry failed tasks" not in page.text  # nothing failed yet
        _failed_for_good(svc, src, 1)
        page = c.get(f"/console/runs/{run_id}")
        assert "Retry failed tasks" in page.text
        assert f'action="/console/runs/{run_id}/retry"' in page.text
        assert c.post(f"/console/runs/{run_id}/retry").status_code == 403
        assert _status(svc, src)["status"] == "failed"
        r = c.post(f"/console/runs/{run_id}/retry", data={"csrf": csrf_of(page)})
        assert r.status_code == 303 and r.headers["location"] == f"/console/runs/{run_id}"
        assert _status(svc, src)["status"] == "queued"
        assert "Retry failed tasks" not in c.get(f"/console/runs/{run_id}").text
    _, bob_key = user(svc, "bob")
    with console(url, bob_key) as c:
        assert post(c, f"/console/runs/{run_id}/retry").status_code == 404
