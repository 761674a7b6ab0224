"""The API process killed (SIGKILL, at a fault point inside its transaction) mid-deploy and
mid-completion: nothing half-written is left, and the work goes on once it is back. (Many
processes killed at once: test_many_processes.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.cli import TRACE
from tests.support.dags import three_jobs
from tests.support.fleet import Api, fleet_env
from tests.support.invariants import assert_invariants
from tests.support.sandbox import bind_env
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.services import Services

pytestmark = pytest.mark.slow


@pytest.fixture
def api(settings: Settings, dsn: str) -> Iterator[Api]:
    a = Api(fleet_env(settings, dsn, lease_seconds=30), settings.home)
    yield a
    a.stop()


def counts(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        return {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
            for t in ("dags", "dag_versions", "datasets", "dag_subscriptions", "outbox")
        }


def attempts(dsn: str, task_id: uuid.UUID) -> list[tuple[str, str]]:
    """(task status, attempt outcome) of each attempt of the task."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT s.status, a.outcome FROM task_status s JOIN task_attempts a "
            "USING (task_id, start_day) WHERE s.task_id = %s ORDER BY a.attempt",
            [task_id],
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def test_an_api_killed_mid_deploy_leaves_nothing_half_written(api: Api, dsn: str) -> None:
    api.start(faults="deploy.before_commit")
    before = counts(dsn)
    with pytest.raises(httpx.TransportError):  # the process died inside the deploy
        httpx.post(f"{api.url}/v1/dags", json={"yaml": three_jobs()}, timeout=60)
    assert api.died() == -signal.SIGKILL
    assert counts(dsn) == before  # the deploy's transaction never committed
    api.start()
    r = httpx.post(f"{api.url}/v1/dags", json={"yaml": three_jobs()}, timeout=60)
    assert r.status_code == 201, r.text
    assert httpx.get(f"{api.url}/v1/dags/hello").json()["active_version"] == 1


def test_an_api_killed_mid_completion_loses_no_work(
    api: Api, settings: Settings, dsn: str, tmp_path: Path
) -> None:
    """The API dies as it records a task's success, before anything of it lands (a plain
    success is one statement, committed as it runs: the fault point comes before it); the
    worker's report fails, it keeps retrying while its lease holds, the restarted API accepts
    it: the first attempt succeeds, nothing is run twice."""
    api.start(faults="complete.before_commit")
    worker_env = {**os.environ, **api.env, **bind_env(tmp_path)}
    with (tmp_path / "worker.log").open("ab") as log:
        worker = subprocess.Popen(
            [*TRACE, "worker", "--api-url", api.url], env=worker_env, stdout=log, stderr=log
        )
    try:
        r = httpx.post(
            f"{api.url}/v1/tasks",
            json={"job": "crash", "operator": "sleep", "config": {"seconds": 1}},
        )
        assert r.status_code == 201, r.text
        task_id = uuid.UUID(r.json()["task_id"])
        assert api.died() == -signal.SIGKILL  # at the completion
        assert attempts(dsn, task_id) == [("running", "running")]  # nothing of it landed
        api.start()
        svc = Services.build(settings, dsn)
        try:
            view = wait_for(
                lambda: (v := svc.dispatcher.get_task(task_id)).status == "succeeded" and v,
                60,
                "the task to succeed",
            )
            assert [a.outcome for a in view.attempts] == ["succeeded"]
            assert_invariants(svc)
        finally:
            svc.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
