"""Issue 38 on the real Lite stack (as root: the sandbox needs it): a hostile worker pool slot
cannot flood a worker with egress gateways, the gateway refuses non-public upstreams an admin
did not allow, operator hosts run under resource limits, and the trusted hot_window sink runs
sandboxed too, with only its sink login."""

from __future__ import annotations

import os
import pwd
import threading
import uuid
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.chaos.test_sandbox import _Rpc, probe
from tests.support.dags import admin, dag_probe
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.contract import DatasetRef, TaskSpec
from trace_platform.lite.stack import LiteStack

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="the sandbox needs root (own user, namespaces); non-root workers run without it",
    ),
]

ENV = {"TRACE_QUEUE_POLL_SECONDS": "0.2"}


@pytest.fixture
def stack(settings: Settings, dsn: str) -> Iterator[LiteStack]:
    s = LiteStack(settings, workers=1, dsn=dsn, worker_env=ENV)
    s.start()
    yield s
    s.stop()


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


class _PeakThreads:
    """The most threads `pid` had at any sample, sampled every 10 ms until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            try:
                self.peak = max(self.peak, _threads(self.pid))
            except OSError:
                return

    def __enter__(self) -> _PeakThreads:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_a_slot_with_thousands_of_rpc_urls_fails_at_once_naming_the_cap(
    stack: LiteStack,
) -> None:
    """Before, each of 2,000 URLs got a gateway (a listener, a thread, an HTTP client) before
    the first heartbeat: thousands of threads in the worker, the lease lost while setting up."""
    svc, me = stack.services, admin(stack.services)
    env = ", ".join(f'U{i}: "http://8.8.{i // 256}.{i % 256}:8545/"' for i in range(2000))
    svc.control.deploy(
        me,
        f"""
name: flood
worker_pools:
  rpc:
    - env: {{{env}}}
jobs:
  look:
    operator: noop
    worker_pool: rpc
    max_attempts: 2
""",
    )
    (task_id,) = svc.control.trigger(me, "flood")["tasks"]
    with _PeakThreads(stack.workers[0].pid) as peak:
        view = wait_for(
            lambda: (
                (v := svc.dispatcher.get_task(uuid.UUID(str(task_id)))).status
                in ("failed", "succeeded")
                and v
            ),
            180,
            "the flood's task",
        )
    assert peak.peak < 100, f"{peak.peak} threads in the worker ({view.last_error})"
    assert view.status == "failed", view
    error = view.last_error or ""
    assert "2,000 RPC URLs" in error and "at most 16 per task" in error, error
    assert view.attempt == 1, view  # permanent: not tried again


@pytest.fixture
def internal() -> Iterator[int]:
    """A loopback service that is not the platform's (a cache, an admin port): its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Rpc)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "target",
    ["loopback", "localhost", "unresolvable", "metadata"],
)
def test_non_public_rpc_upstreams_are_refused_unless_allowed(
    stack: LiteStack, internal: int, target: str
) -> None:
    url = {
        "loopback": f"http://127.0.0.1:{internal}/",
        "localhost": f"http://localhost:{internal}/",
        "unresolvable": "http://no-such-rpc.invalid:8545/",
        "metadata": "http://169.254.169.254/latest/meta-data/",
    }[target]
    outcome = dag_probe(
        stack,
        admin(stack.services),
        f"reach_{target}",
        f"""
worker_pools:
  rpc:
    - env: {{RPC_URL: "{url}"}}
jobs:
  look:
    operator: probe
    config: {{rpc_env: [RPC_URL]}}
    worker_pool: rpc
    max_attempts: 1
""",
    )
    assert outcome.get("status") == "failed", outcome  # no probe report: it never ran
    assert "network egress refused" in outcome["error"], outcome
    assert "TRACE_EGRESS_ALLOW" in outcome["error"], outcome


def test_operator_hosts_run_under_resource_limits(settings: Settings, dsn: str) -> None:
    """No cgroup v2 here (rlimits then): the host's processes cannot take more than the
    limit each, and a local Spark JVM still runs under it. Before, nothing bounded them."""
    env = {**ENV, "TRACE_SANDBOX_MEMORY_MB": "1024", "TRACE_SANDBOX_PIDS": "2048"}
    with LiteStack(settings, workers=1, dsn=dsn, worker_env=env) as stack:
        report = probe(
            stack,
            {"limits": True, "allocate_mb": 1536, "spark_sql": ["SELECT 41 + 1 AS answer"]},
        )
    limits = report["limits"]
    if "memory" not in limits["cgroup"]:  # rlimits (cgroup v2 sets memory.max instead)
        assert limits["DATA"] == 1024 << 20 and limits["NPROC"] == 2048, limits
    assert limits["NOFILE"] == 8192, limits
    assert report["allocate"].startswith("refused: MemoryError"), report["allocate"]
    assert report["spark"]["SELECT 41 + 1 AS answer"] == "ALLOWED: [(42,)]", report["spark"]


def _host_processes(root: int) -> list[tuple[int, int]]:
    """(pid, uid) of every operator host process under `root` (a worker)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    hosts = []
    for pid in parent:
        p = pid
        while p in parent and p not in (root, 0, 1):
            p = parent[p]
        if p != root:
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if b"trace_platform.worker.host_main" in cmd:
            uid = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("Uid:"))
            hosts.append((pid, uid))
    return hosts


def test_the_hot_window_sink_runs_sandboxed_with_its_sink_login(stack: LiteStack) -> None:
    """Before, the trusted host ran outside the sandbox, as root, without limits. Now it runs
    as the sandbox user, and reaches Postgres only through the forward its task got."""
    d = stack.services.dispatcher
    source, out = uuid.uuid4(), uuid.uuid4()
    schema = f"dataset_{out.hex}"
    ref = d.create_task(
        TaskSpec(
            job="hot",
            operator="hot_window",
            config={"window_blocks": 10},
            input_event={"dataset_uuid": str(source), "range": {"start": 0, "end": 10}},
            input_versions=[
                DatasetRef(dataset_uuid=source, location=f"org/x/dataset/{source}/version/v/")
            ],
            outputs=[
                DatasetRef(
                    dataset_uuid=out,
                    dataset_version=uuid.uuid4(),
                    backend="postgres",
                    location=f"{schema}.t",
                )
            ],
            max_attempts=1,
        )
    )
    view = wait_for(
        lambda: (v := d.get_task(ref.task_id)).status in ("failed", "succeeded", "canceled") and v,
        120,
        "hot_window task",
    )
    # It reached Postgres (through the forward): its dataset schema is there, whatever the
    # Dispatcher then made of its commit (no such version was assigned).
    with stack.services.pool.connection() as conn:
        made = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema]).fetchone()
    assert made is not None, view.last_error
    hosts = _host_processes(stack.workers[0].pid)
    sandbox_uid = pwd.getpwnam(stack.settings.sandbox_user).pw_uid
    assert hosts and all(uid == sandbox_uid for _, uid in hosts), hosts
