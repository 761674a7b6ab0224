"""Many processes on one database, as a supervisor runs them: two API processes (each with its
publisher, reaper and cutover loops), two schedulers and three workers. Mid-run one of each kind
is SIGKILLed (the API restarted, as a supervisor would); every run still ends with every task
succeeded, and the invariants hold."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.dags import admin, finished_run, three_jobs
from tests.support.devnet import devnet_fixture, small_demo_dag
from tests.support.fleet import Fleet, fleet_env
from tests.support.invariants import assert_datasets_complete, assert_invariants
from tests.support.wait import wait_for
from trace_platform.chain import Rpc, calldata
from trace_platform.config import Settings
from trace_platform.contract import TERMINAL
from trace_platform.devnet import ChainInfo, ChainSpec
from trace_platform.lite.demo import saved_rows
from trace_platform.services import Services

pytestmark = pytest.mark.slow
SPEC = ChainSpec(seed=11, blocks=300, accounts=30, validators=4, epoch_blocks=50)


@pytest.fixture
def fleet(settings: Settings, dsn: str, tmp_path: Path) -> Iterator[tuple[Fleet, Services]]:
    f = Fleet(fleet_env(settings, dsn, lease_seconds=4), settings.home, tmp_path)
    svc = Services.build(settings, dsn)
    try:
        yield f, svc
    finally:
        f.close()
        svc.close()


def succeeded(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM task_status WHERE status = 'succeeded'").fetchone()
    return int(row[0]) if row else 0


def kill_one_of_each(f: Fleet) -> None:
    """One API (restarted, as a supervisor would; its worker keeps retrying meanwhile), one
    scheduler and one worker, SIGKILLed at once."""
    f.apis[1].kill()
    f.procs[0].send_signal(signal.SIGKILL)  # a scheduler
    f.procs[2].send_signal(signal.SIGKILL)  # a worker (of the first API)
    f.apis[1].start()


def start(f: Fleet) -> None:
    apis = [f.api(), f.api()]
    f.scheduler(), f.scheduler()
    f.worker(apis[0]), f.worker(apis[0]), f.worker(apis[1])


def test_many_processes_one_database_one_of_each_kind_killed(
    fleet: tuple[Fleet, Services], dsn: str
) -> None:
    """Webhook runs of a three-job DAG through both APIs."""
    f, svc = fleet
    start(f)
    r = httpx.post(f"{f.apis[0].url}/v1/dags", json={"yaml": three_jobs()}, timeout=60)
    assert r.status_code == 201, r.text
    runs = []
    for i in range(6):
        hook = httpx.post(f"{f.apis[i % 2].url}/v1/hooks/hello/poke", json={"i": i})
        assert hook.status_code == 201, hook.text
        runs.append(hook.json()["run_id"])
    wait_for(lambda: succeeded(dsn) >= 15, 120, "the runs under way")
    kill_one_of_each(f)

    def finished() -> list[dict[str, Any]] | None:
        """Every task of the webhook runs ended (downstream tasks are made with their
        upstream's completion, so all terminal means done) and nothing else is pending."""
        per_run = [svc.control.show_run(admin(svc), run)["tasks"] for run in runs]
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM task_status WHERE status IN ('queued', 'running')"
            ).fetchone()
        if row is None or row[0] or any(len(tasks) < 3 for tasks in per_run):
            return None
        tasks = [t for tasks in per_run for t in tasks]
        return tasks if all(t["status"] in TERMINAL for t in tasks) else None

    tasks = wait_for(finished, 240, "every run to end")
    assert {t["status"] for t in tasks} == {"succeeded"}, [
        (t["job"], t["status"], t["last_error"]) for t in tasks if t["status"] != "succeeded"
    ]
    assert_invariants(svc)


devnet = devnet_fixture(SPEC)


def test_a_whole_demo_run_on_many_processes_one_of_each_kind_killed(
    fleet: tuple[Fleet, Services], dsn: str, devnet: tuple[str, ChainInfo]
) -> None:
    """The demo DAG (Cryo sync, Spark decode, the analytics) deployed through one API and
    triggered through the other; one of each kind killed once the sync is under way. The data
    still covers exactly the requested blocks and the token's supply is the node's."""
    url, info = devnet
    f, svc = fleet
    start(f)
    dag = small_demo_dag(url)
    r = httpx.post(f"{f.apis[0].url}/v1/dags", json={"yaml": dag}, timeout=120)
    assert r.status_code == 201, r.text
    config = {"from_block": 0, "to_block": SPEC.blocks - 1, "chunk_size": 100}
    r = httpx.post(
        f"{f.apis[1].url}/v1/dags/monad_demo/trigger", json={"config": config}, timeout=60
    )
    assert r.status_code == 201, r.text
    run_id = r.json()["run_id"]
    wait_for(lambda: succeeded(dsn) >= 4, 300, "the sync under way")
    kill_one_of_each(f)

    tasks = finished_run(svc, run_id, 900)
    assert all(t["status"] == "succeeded" for t in tasks), [
        (t["job"], t["status"], t["last_error"]) for t in tasks if t["status"] != "succeeded"
    ]
    per_job = {j: sum(t["job"] == j for t in tasks) for j in {t["job"] for t in tasks}}
    assert per_job["ingest"] == 3 and per_job["token_supply"] == 1
    assert_datasets_complete(svc, span=(0, SPEC.blocks))
    me = admin(svc)
    rows = svc.query.query(me, "SELECT count(*), max(block_number) FROM blocks").as_json()
    assert rows["rows"] == [[SPEC.blocks, SPEC.blocks - 1]]
    head = SPEC.blocks - 1
    supply = {
        r["block_number"]: int(r["total_supply"])
        for r in saved_rows(svc, me, "token_supply", token=info.token)
    }
    assert supply[head] == Rpc(url).eth_call(info.token, calldata("totalSupply()"), head)
    assert_invariants(svc)
