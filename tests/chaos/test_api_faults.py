"""The API process killed (SIGKILL, at a fault point inside its transaction) mid-deploy and
mid-completion: nothing half-written is left, and the work goes on once it is back."""

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
from tests.support.dags import admin, three_jobs
from tests.support.invariants import assert_invariants
from tests.support.sandbox import bind_env
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.contract import TERMINAL
from trace_platform.db.embedded import free_port
from trace_platform.services import Services

pytestmark = pytest.mark.slow


class Api:
    """`trace api` as its own process, restartable on the same port."""

    def __init__(self, env: dict[str, str], home: Path) -> None:
        self.env, self.port, self.log = env, free_port(), home / "api.log"
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, faults: str = "") -> None:
        env = {**os.environ, **self.env, "TRACE_FAULTS": faults}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*TRACE, "api", "--port", str(self.port)], env=env, stdout=log, stderr=log
            )
        wait_for(self.up, 60, "the API to answer")

    def up(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def died(self) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def api(settings: Settings, dsn: str) -> Iterator[Api]:
    settings.home.mkdir(parents=True, exist_ok=True)
    env = {
        "TRACE_STATE_DSN": dsn,
        "TRACE_HOME": str(settings.home),
        "TRACE_AUTH": "permissive",
        "TRACE_LEASE_SECONDS": "30",
        "TRACE_HEARTBEAT_SECONDS": "1",
        "TRACE_QUEUE_POLL_SECONDS": "0.2",
    }
    a = Api(env, settings.home)
    yield a
    a.stop()


def counts(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        return {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
            for t in ("dags", "dag_versions", "datasets", "dag_subscriptions", "outbox")
        }


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
    """The API dies inside the transaction that records a task's success; the worker's report
    fails, it keeps retrying while its lease holds, the restarted API accepts it: the first
    attempt succeeds, nothing is run twice."""
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


def test_many_processes_one_database_one_of_each_kind_killed(
    settings: Settings, dsn: str, tmp_path: Path
) -> None:
    """Two API processes (each with its publisher, reaper and cutover loops), two schedulers and
    three workers on one database; webhooks through both APIs; mid-run one API, one scheduler
    and one worker are SIGKILLed (the API restarted, as a supervisor would): every run ends
    with every task succeeded, and the invariants hold."""
    settings.home.mkdir(parents=True, exist_ok=True)
    env = {
        "TRACE_STATE_DSN": dsn,
        "TRACE_HOME": str(settings.home),
        "TRACE_AUTH": "permissive",
        "TRACE_LEASE_SECONDS": "4",
        "TRACE_HEARTBEAT_SECONDS": "1",
        "TRACE_QUEUE_POLL_SECONDS": "0.2",
    }
    apis = [Api(env, settings.home), Api(env, settings.home)]
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(*args: str) -> subprocess.Popen[bytes]:
        with (tmp_path / f"{args[0]}-{len(procs)}.log").open("ab") as log:
            p = subprocess.Popen(
                [*TRACE, *args],
                env={**os.environ, **env, **bind_env(tmp_path)},
                stdout=log,
                stderr=log,
            )
        procs.append(p)
        return p

    svc = Services.build(settings, dsn)
    try:
        for a in apis:
            a.start()
        schedulers = [spawn("scheduler"), spawn("scheduler")]
        workers = [
            spawn("worker", "--api-url", apis[0].url),
            spawn("worker", "--api-url", apis[0].url),
            spawn("worker", "--api-url", apis[1].url),
        ]
        r = httpx.post(f"{apis[0].url}/v1/dags", json={"yaml": three_jobs()}, timeout=60)
        assert r.status_code == 201, r.text
        runs = []
        for i in range(6):
            hook = httpx.post(f"{apis[i % 2].url}/v1/hooks/hello/poke", json={"i": i})
            assert hook.status_code == 201, hook.text
            runs.append(hook.json()["run_id"])

        def succeeded() -> int:
            with psycopg.connect(dsn) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM task_status WHERE status = 'succeeded'"
                ).fetchone()
            return int(row[0]) if row else 0

        wait_for(lambda: succeeded() >= 15, 120, "the runs under way")
        assert apis[1].proc is not None
        apis[1].proc.send_signal(signal.SIGKILL)
        schedulers[0].send_signal(signal.SIGKILL)
        workers[0].send_signal(signal.SIGKILL)
        apis[1].died()
        apis[1].start()  # its worker kept retrying meanwhile

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
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for a in apis:
            a.stop()
        svc.close()
