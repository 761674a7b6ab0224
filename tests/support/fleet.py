"""Trace's processes as a supervisor runs them, each its own OS process on one database: API
processes (restartable on their port), schedulers and workers, logs under the test's tmp dir."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx

from tests.support.cli import TRACE
from tests.support.sandbox import bind_env
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.db.embedded import free_port


def fleet_env(settings: Settings, dsn: str, lease_seconds: float) -> dict[str, str]:
    settings.home.mkdir(parents=True, exist_ok=True)
    return {
        "TRACE_STATE_DSN": dsn,
        "TRACE_HOME": str(settings.home),
        "TRACE_AUTH": "permissive",
        "TRACE_LEASE_SECONDS": str(lease_seconds),
        "TRACE_HEARTBEAT_SECONDS": "1",
        "TRACE_QUEUE_POLL_SECONDS": "0.2",
    }


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

    def kill(self) -> None:
        """SIGKILL, and wait until it is gone."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.died()

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


class Fleet:
    def __init__(self, env: dict[str, str], home: Path, logs: Path) -> None:
        self.env, self.home, self.logs = env, home, logs
        self.apis: list[Api] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def api(self) -> Api:
        a = Api(self.env, self.home)
        a.start()
        self.apis.append(a)
        return a

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        with (self.logs / f"{args[0]}-{len(self.procs)}.log").open("ab") as log:
            p = subprocess.Popen(
                [*TRACE, *args],
                env={**os.environ, **self.env, **bind_env(self.logs)},
                stdout=log,
                stderr=log,
            )
        self.procs.append(p)
        return p

    def scheduler(self) -> subprocess.Popen[bytes]:
        return self.spawn("scheduler")

    def worker(self, api: Api) -> subprocess.Popen[bytes]:
        return self.spawn("worker", "--api-url", api.url)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for a in self.apis:
            a.stop()
