"""The Lite stack as local processes: API + Dispatcher loops in this process, N workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from trace_platform.api.app import create_app
from trace_platform.config import Settings, adapter_env, url_host
from trace_platform.db.embedded import free_port
from trace_platform.objectstore import store_env
from trace_platform.services import Services
from trace_platform.tls import uvicorn_tls


class ApiServer:
    """uvicorn in a background thread, so the caller keeps the main thread."""

    def __init__(
        self, services: Services, host: str, port: int, *, background: bool = True
    ) -> None:
        tls = uvicorn_tls(services.settings)  # https with TRACE_API_TLS_CERT (docs/tls.md)
        self.url = f"{'https' if tls else 'http'}://{url_host(host)}:{port}"
        self.app = create_app(services, background=background)
        config = uvicorn.Config(
            self.app,
            host=host,
            port=port,
            log_level="warning",
            **tls,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="api", daemon=True)

    def start(self, timeout: float = 20.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"API server did not start on {self.url} (port in use?)")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def worker_command(
    api_url: str,
    *,
    concurrency: int = 1,
    exchange_url: str | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trace_platform.cli.main",
        "worker",
        "--api-url",
        api_url,
        "--concurrency",
        str(concurrency),
        *(["--exchange-url", exchange_url] if exchange_url else []),
        *(extra or []),
    ]


def egress_allow(allow: str, *more: str) -> str:
    """A TRACE_EGRESS_ALLOW value (comma-separated, or a JSON list) with `more` entries added."""
    entries = json.loads(allow) if allow.strip().startswith("[") else allow.split(",")
    out = [e.strip() for e in entries if e.strip()]
    return ",".join(out + [e for e in more if e not in out])


def with_devnet(allow: str) -> str:
    """A TRACE_EGRESS_ALLOW value that also allows this home's devnet (`trace devnet up`, the
    demo's): the one loopback RPC a Lite stack's operators may reach besides what it lists."""
    return egress_allow(allow, "devnet")


class LiteStack:
    def __init__(
        self,
        settings: Settings,
        *,
        workers: int = 2,
        port: int | None = None,
        dsn: str | None = None,
        worker_env: dict[str, str] | None = None,
        log_dir: Path | None = None,
        worker_concurrency: int = 1,
        sinks: int = 1,
        deliverers: int = 1,
        lambda_invokers: int = 1,
    ) -> None:
        if settings.exchange_port is None:  # the workers' exchange on its own listener
            settings = settings.model_copy(update={"exchange_port": free_port()})
        self.settings = settings
        self.n_workers = workers
        self.port = port or free_port()
        self.services = Services.build(settings, dsn)
        self.api = ApiServer(self.services, settings.api_host, self.port)
        self.workers: list[subprocess.Popen[bytes]] = []
        # The trusted loaders of buffered datasets (`trace sink`) and the Delivery Services
        # (`trace delivery`: alerts' webhooks), as processes of their own.
        self.daemon_counts = {"sink": sinks, "delivery": deliverers}
        # The lambda runtime's invokers (`trace lambda-invoker`, docs/lambda.md): Lite's runs
        # the handler in a sandboxed subprocess, so a lambda job needs no configuration.
        self.lambda_invokers = lambda_invokers
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.worker_env = worker_env or {}
        self.worker_concurrency = worker_concurrency
        self.log_dir = log_dir or settings.home / "logs"

    @property
    def url(self) -> str:
        return self.api.url

    @property
    def exchange_url(self) -> str:
        scheme = "https" if self.settings.api_tls_cert is not None else "http"
        return f"{scheme}://{url_host(self.settings.api_host)}:{self.settings.exchange_port}"

    def start(self) -> LiteStack:
        self.api.start()
        for _ in range(self.n_workers):
            self.add_worker()
        for command, n in self.daemon_counts.items():
            for i in range(n):
                argv = [sys.executable, "-m", "trace_platform.cli.main", command]
                self.daemons.append(self._spawn(f"{command}-{i}", argv, self._env()))
        for i in range(self.lambda_invokers):
            argv = [sys.executable, "-m", "trace_platform.cli.main", "lambda-invoker"]
            argv += ["--api-url", self.url]
            self.daemons.append(self._spawn(f"lambda-invoker-{i}", argv, self._env()))
        return self

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A process of the stack's environment: this one's, the stack's adapters (profile,
        queue, object store), its database and home."""
        return {
            **os.environ,
            **adapter_env(self.settings),
            **store_env(self.settings),
            "TRACE_STATE_DSN": self.services.dsn,
            "TRACE_HOME": str(self.settings.home),
            **self.worker_env,
            **(extra or {}),
        }

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{name}.out").open("ab") as logf:
            return subprocess.Popen(argv, env=env, stdout=logf, stderr=logf)

    def exited_workers(self) -> list[int]:
        return [i for i, p in enumerate(self.workers) if p.poll() is not None]

    def restart_worker(self, index: int) -> None:
        self.workers[index] = self._spawn_worker(index)

    def add_worker(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = self._spawn_worker(len(self.workers), env)
        self.workers.append(proc)
        return proc

    def _spawn_worker(
        self, index: int, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        full_env = self._env(env)
        full_env["TRACE_EGRESS_ALLOW"] = with_devnet(full_env.get("TRACE_EGRESS_ALLOW", ""))
        argv = worker_command(
            self.url, concurrency=self.worker_concurrency, exchange_url=self.exchange_url
        )
        return self._spawn(f"worker-{index}", argv, full_env)

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        # All asked at once, so the stop takes the slowest one's time, not their sum. A sink or
        # a Delivery Service stops between batches (one killed loses nothing either); a worker
        # drains first: its running tasks may finish (worker_drain_seconds).
        for p in (*self.daemons, *self.workers):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        now = time.monotonic()
        for p, deadline in (
            *((p, now + 15) for p in self.daemons),
            *((p, now + self.settings.worker_drain_seconds + 15) for p in self.workers),
        ):
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.api.stop()
        self.services.close()

    def __enter__(self) -> LiteStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
