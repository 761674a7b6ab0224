"""A real Spark standalone cluster on this machine, from the pyspark distribution's own classes: a
master, workers (each its own JVM, launching its own executor JVM) and a Spark Connect server
(the cluster's driver) that Trace's operator hosts reach at `sc://127.0.0.1:<port>`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pyspark

from trace_platform.db.embedded import free_port
from trace_platform.spark import jit_options

SPARK_HOME = Path(pyspark.__file__).parent
CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"


class SparkCluster:
    def __init__(self, root: Path, env: dict[str, str], *, workers: int = 2) -> None:
        """`env`: what the driver and the executors get besides the basics (the object store's
        TRACE_* settings, as a cluster operator would configure them)."""
        self.root = root
        self.env = env
        self.n_workers = workers
        self.master_port, self.ui_port, self.connect_port = free_port(), free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def remote(self) -> str:
        return f"sc://127.0.0.1:{self.connect_port}"

    def _spawn(self, name: str, argv: list[str], extra: dict[str, str] | None = None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOG_DIR": str(self.root),
            # The master's and workers' own JVMs: small, short-lived, C1 is plenty.
            "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
            **(extra or {}),
        }
        log = (self.root / f"{name}.log").open("wb")
        self.procs.append(
            subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def start(self, timeout: float = 120.0) -> SparkCluster:
        cls = str(SPARK_HOME / "bin" / "spark-class")
        self._spawn(
            "master",
            [
                cls,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.ui_port),
            ],
        )
        for i in range(self.n_workers):
            self._spawn(
                f"worker{i}",
                [
                    cls,
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    "0",
                    self.master,
                ],
                {"SPARK_WORKER_DIR": str(self.root / f"worker{i}")},
            )
        deadline = time.monotonic() + timeout
        self._wait(lambda: self._alive_workers() >= self.n_workers, deadline, "workers")
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.connect_port),
            "spark.ui.enabled": "false",
            "spark.executor.memory": "768m",
            "spark.cores.max": str(self.n_workers),
            "spark.sql.shuffle.partitions": "4",
            # The Connect server's and executors' JVMs on the tests' profile (TRACE_SPARK_JIT).
            "spark.driver.extraJavaOptions": jit_options(),
            "spark.executor.extraJavaOptions": jit_options(),
            **{f"spark.executorEnv.{k}": v for k, v in self.env.items()},
        }
        argv = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", CONNECT_SERVER]
        argv += ["--master", self.master, "--name", "trace-connect"]
        for k, v in conf.items():
            argv += ["--conf", f"{k}={v}"]
        self._spawn("connect", [*argv, "spark-internal"], self.env)
        self._wait(self._connect_up, deadline, "the Spark Connect server")
        return self

    def _alive_workers(self) -> int:
        try:
            url = f"http://127.0.0.1:{self.ui_port}/json/"
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(json.loads(r.read()).get("aliveworkers", 0))
        except (OSError, ValueError):  # not up, or (still starting) its HTML page, not JSON
            return 0

    def _connect_up(self) -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", self.connect_port), timeout=1),
        ):
            return True
        return False

    def _wait(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        while not ready():
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark process exited ({p.args}); see {self.root}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not come up; logs in {self.root}")
            time.sleep(0.5)

    def executors(self) -> int:
        """Cores the master granted the cluster's application (one per worker's executor):
        that the executors run, not that they did the work (the test checks the files)."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=2) as r:
            apps = json.loads(r.read()).get("activeapps", [])
        return sum(int(a.get("cores", 0)) for a in apps)

    def stop(self) -> None:
        for p in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
