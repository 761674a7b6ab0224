"""DAG runs through the whole Lite stack with real worker processes."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.support.dags import admin, finished_run, three_jobs
from tests.support.invariants import assert_invariants
from tests.support.sandbox import bind_env, record_dir
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.lite.stack import LiteStack
from trace_platform.triggers.cron import tick

pytestmark = pytest.mark.slow
# rpc-a and rpc-b do not resolve: allowed by name, as an admin allows an internal RPC.
WORKER_ENV = {"TRACE_QUEUE_POLL_SECONDS": "0.2", "TRACE_EGRESS_ALLOW": "rpc-a,rpc-b"}


@pytest.fixture
def stack(
    settings: Settings, dsn: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[LiteStack]:
    s = LiteStack(
        settings,
        workers=getattr(request, "param", 2),
        dsn=dsn,
        worker_env={**WORKER_ENV, **bind_env(tmp_path)},
    )
    s.start()
    yield s
    s.stop()


def check_tree(tasks: list[dict[str, object]], record: Path, run_id: uuid.UUID) -> None:
    by_job: dict[str, list[dict[str, object]]] = {}
    for t in tasks:
        by_job.setdefault(str(t["job"]), []).append(t)
    assert {j: len(ts) for j, ts in by_job.items()} == {"source": 1, "transform": 3, "sink": 3}
    assert all(t["status"] == "succeeded" and t["attempt"] == 1 for t in tasks)
    source = by_job["source"][0]["task_id"]
    assert {t["parent_task_id"] for t in by_job["transform"]} == {source}
    assert {t["parent_task_id"] for t in by_job["sink"]} == {
        t["task_id"] for t in by_job["transform"]
    }
    # Each sink ran exactly once, for its own event.
    lines = record.read_text().split("\n")[:-1]
    sinks = {str(t["task_id"]) for t in by_job["sink"]}
    ran = [ln.split()[0] for ln in lines if ln.split()[0] in sinks]
    assert sorted(ran) == sorted(sinks), (ran, sinks, run_id)


def test_three_job_dag_from_cron_and_from_webhook(stack: LiteStack, tmp_path: Path) -> None:
    record = record_dir(tmp_path) / "sinks.txt"
    svc = stack.services
    svc.control.deploy(admin(svc), three_jobs(record=str(record)))
    assert tick(svc.dispatcher, datetime.now(UTC) + timedelta(seconds=61)) == 1
    (cron_run,) = [r["run_id"] for r in svc.control.list_runs(admin(svc))]
    tasks = finished_run(svc, cron_run, 60)
    check_tree(tasks, record, cron_run)

    r = httpx.post(f"{stack.url}/v1/hooks/hello/poke", json={"n": 1})  # permissive Lite auth
    assert r.status_code == 201, r.text
    hook_run = uuid.UUID(r.json()["run_id"])
    tasks = finished_run(svc, hook_run, 60)
    check_tree(tasks, record, hook_run)
    assert len(record.read_text().split("\n")[:-1]) == 6
    assert_invariants(svc)


POOLED = """
name: pooled
worker_pools:
  rpc:
    - {{env: {{RPC_URL: "http://rpc-a"}}, secrets: {{RPC_KEY: key_a}}}}
    - {{env: {{RPC_URL: "http://rpc-b"}}, secrets: {{RPC_KEY: key_b}}}}
jobs:
  fetch:
    operator: {operator}
    config: {config}
    worker_pool: rpc
    scaling: {{max_concurrency: 5}}
    max_attempts: 3
"""


@pytest.mark.parametrize("stack", [4], indirect=True)
def test_pool_of_two_never_runs_more_than_two_even_after_a_killed_worker(
    stack: LiteStack, tmp_path: Path
) -> None:
    svc, me = stack.services, admin(stack.services)
    svc.control.set_secret(me, "key_a", "secret-a")
    svc.control.set_secret(me, "key_b", "secret-b")
    svc.control.deploy(me, POOLED.format(operator="sleep", config="{seconds: 1.5}"))
    ids = [svc.control.trigger(me, "pooled")["tasks"][0] for _ in range(5)]
    peak = 0
    killed = False
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with svc.pool.connection() as conn:
            running = conn.execute(
                "SELECT count(*) AS n FROM task_status WHERE status = 'running'"
            ).fetchone()["n"]  # type: ignore[index]
            held = conn.execute(
                "SELECT count(*) AS n FROM pool_slots WHERE leased_by_task IS NOT NULL"
            ).fetchone()["n"]  # type: ignore[index]
            done = conn.execute(
                "SELECT count(*) AS n FROM task_status WHERE status = 'succeeded'"
            ).fetchone()["n"]  # type: ignore[index]
        peak = max(peak, running, held)
        if not killed and running == 2:
            # Both slots busy (the pool's bound reached), SIGKILL a worker that is running a
            # task: its slot must come back via the reaper, and the bound hold throughout.
            with svc.pool.connection() as conn:
                wid = conn.execute(
                    "SELECT worker_id FROM task_status WHERE status = 'running' LIMIT 1"
                ).fetchone()
            pid = int(str(wid["worker_id"]).split(":")[1]) if wid else None  # type: ignore[index]
            for p in stack.workers:
                if p.pid == pid:
                    p.send_signal(signal.SIGKILL)
                    killed = True
        if done == len(ids):
            break
        time.sleep(0.05)
    assert killed and peak == 2  # reached, never passed
    assert [svc.dispatcher.get_task(t).status for t in ids] == ["succeeded"] * 5
    with svc.pool.connection() as conn:
        assert (
            conn.execute(
                "SELECT count(*) AS n FROM pool_slots WHERE leased_by_task IS NOT NULL"
            ).fetchone()["n"]
            == 0
        )  # type: ignore[index]
    assert_invariants(svc)


def test_slot_env_and_secrets_reach_the_operator(stack: LiteStack, tmp_path: Path) -> None:
    record = record_dir(tmp_path) / "env.txt"
    svc, me = stack.services, admin(stack.services)
    svc.control.set_secret(me, "key_a", "secret-a")
    svc.control.set_secret(me, "key_b", "secret-b")
    config = f'{{record_to: "{record}", record_env: [RPC_URL, RPC_KEY]}}'
    svc.control.deploy(me, POOLED.format(operator="noop", config=config))
    ids = [svc.control.trigger(me, "pooled")["tasks"][0] for _ in range(2)]
    wait_for(
        lambda: all(svc.dispatcher.get_task(t).status == "succeeded" for t in ids), 60, "tasks"
    )
    seen = {tuple(ln.split()[2:]) for ln in record.read_text().splitlines()}
    # In the sandbox the slot's RPC is reached through the wrapper's gateway on loopback.
    urls = {s[0] for s in seen}
    assert all(u.startswith("RPC_URL=http://127.0.0.1:") for u in urls), urls
    assert {s[1] for s in seen} <= {"RPC_KEY=secret-a", "RPC_KEY=secret-b"}
    assert seen
    logs = "".join(p.read_text() for p in (svc.settings.home / "logs").glob("*"))
    assert "secret-a" not in logs and "secret-b" not in logs  # never logged
