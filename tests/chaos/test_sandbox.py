"""The operator sandbox, attacked from inside by the `probe` test operator (as root only: the
sandbox needs root to switch users and create namespaces)."""

from __future__ import annotations

import json
import os
import pwd
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.support.dags import admin, dag_probe, user
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.contract import TaskSpec
from trace_platform.lite.stack import LiteStack
from trace_platform.operators.testing import probe_report

PROJECT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="the sandbox needs root (own user, namespaces); non-root workers run without it",
    ),
]


class _Rpc(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"jsonrpc":"2.0","id":1,"result":"0x539"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def rpc() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Rpc)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def stack(settings: Settings, dsn: str, rpc: str) -> Iterator[LiteStack]:
    # The test RPC on loopback is reachable only because the admin allows it.
    env = {"TRACE_QUEUE_POLL_SECONDS": "0.2", "TRACE_EGRESS_ALLOW": rpc.removeprefix("http://")}
    s = LiteStack(settings, workers=1, dsn=dsn, worker_env=env)
    s.start()
    yield s
    s.stop()


def probe(stack: LiteStack, config: dict[str, Any]) -> dict[str, Any]:
    d = stack.services.dispatcher
    ref = d.create_task(TaskSpec(job="probe", operator="probe", config=config, max_attempts=1))
    view = wait_for(
        lambda: (v := d.get_task(ref.task_id)).status in ("failed", "succeeded") and v,
        120,
        "probe task",
    )
    report = probe_report(view.last_error or "")
    assert report is not None, view.last_error
    return report


def refused(outcomes: dict[str, str]) -> None:
    allowed = {k: v for k, v in outcomes.items() if not v.startswith("refused")}
    assert not allowed, allowed


def test_operator_cannot_read_keys_environ_or_reach_the_platform(stack: LiteStack) -> None:
    home = stack.settings.home.resolve()
    pg_port = int(conninfo_to_dict(stack.services.dsn)["port"])
    worker_pid = stack.workers[0].pid
    report = probe(
        stack,
        {
            "read": [
                str(home / "admin.key"),
                str(home / "internal.token"),
                str(home / "logs" / "worker-0.out"),
                "/etc/shadow",
                str(PROJECT / ".git" / "config"),
            ],
            "environ_pids": [worker_pid, os.getpid(), 1],
            "connect": [["127.0.0.1", stack.port], ["127.0.0.1", pg_port]],
            "list": [str(home), str(home / "sandbox"), "/root", str(PROJECT)],
            "write": [str(home / "pwned"), "/etc/pwned", "/run/lock/pwned", "/var/crash/pwned"],
        },
    )
    assert report["uid"] == pwd.getpwnam(stack.settings.sandbox_user).pw_uid
    for kind in ("read", "environ", "connect", "write"):
        refused(report[kind])
    # The Trace home is an empty stand-in inside the sandbox; the host's dir holds nothing of it.
    listed = report["list"]
    assert all(v.startswith("refused") or "admin.key" not in v for v in listed.values()), listed
    assert report["cwd_entries"] == []  # a fresh, empty scratch directory
    # The checkout is hidden except its src/ and virtualenv (read-only).
    assert ".git" not in report["list"][str(PROJECT)], report["list"]
    leaked = [
        k for k in report["env_keys"] if k.startswith(("TRACE_STATE", "TRACE_INTERNAL", "PG"))
    ]
    assert leaked == [] and "TRACE_HOME" not in report["env_keys"]
    assert len(report["pids"]) <= 3, report["pids"]  # its own PID namespace
    assert not (home / "pwned").exists()


def test_the_protocol_is_not_on_the_operators_stdin(stack: LiteStack) -> None:
    """fd 0 is /dev/null: an operator reading its stdin (or a process it starts) gets nothing,
    never the wrapper's lines (before, fd 0 was the protocol pipe: a read of it took them)."""
    report = probe(stack, {"read": ["/dev/stdin", "/proc/self/fd/0"], "stdin": True})
    assert report["read"] == {"/dev/stdin": "ALLOWED: ", "/proc/self/fd/0": "ALLOWED: "}
    assert report["stdin"] == "ALLOWED: b''", report["stdin"]  # end of file, not a pipe


def test_rpc_reachable_only_through_its_gateway(stack: LiteStack, rpc: str) -> None:
    svc = stack.services
    port = int(rpc.rsplit(":", 1)[1])
    report = dag_probe(
        stack,
        admin(svc),
        "egress",
        f"""
worker_pools:
  rpc:
    - env: {{RPC_URL: "{rpc}"}}
jobs:
  look:
    operator: probe
    config: {{rpc_env: [RPC_URL], env: [RPC_URL], connect: [["127.0.0.1", {port}]]}}
    worker_pool: rpc
    max_attempts: 1
""",
    )
    assert report["rpc"]["RPC_URL"].startswith("ALLOWED") and "0x539" in report["rpc"]["RPC_URL"]
    assert report["task_env"]["RPC_URL"] != rpc  # the operator sees the gateway, not the node
    refused(report["connect"])  # the node itself is not reachable directly


@pytest.mark.parametrize("service", ["api", "exchange listener"])
def test_rpc_pointing_at_the_platform_is_refused(stack: LiteStack, service: str) -> None:
    port = stack.port if service == "api" else stack.settings.exchange_port
    outcome = dag_probe(
        stack,
        admin(stack.services),
        f"sneaky_{service.replace(' ', '_')}",
        f"""
worker_pools:
  rpc:
    - env: {{RPC_URL: "http://127.0.0.1:{port}/internal"}}
jobs:
  look:
    operator: probe
    worker_pool: rpc
    max_attempts: 1
""",
    )
    assert outcome.get("status") == "failed", outcome  # no probe report: the operator never ran
    assert "network egress refused" in outcome["error"]


def test_store_is_scoped_to_the_tasks_inputs_and_outputs(stack: LiteStack) -> None:
    home = stack.settings.home.resolve()
    foreign = "org/00000000-0000-0000-0000-000000000001/dataset/x/version/y/"
    report = dag_probe(
        stack,
        admin(stack.services),
        "scoped",
        f"""
jobs:
  look:
    operator: probe
    max_attempts: 1
    outputs: [{{backend: parquet}}]
    config:
      store_read: ["{foreign}part-0.parquet"]
      store_write: ["{foreign}evil.parquet", "../../escape"]
      store_write_own: true
      upload_paths: ["/etc/passwd", "link:/etc/passwd", "link:{home}/admin.key"]
""",
    )
    refused(report["store_read"])
    refused(report["store_write"])
    refused(report["upload"])
    assert report["store_write_own"].startswith("ALLOWED"), report["store_write_own"]
    refused({"root": report["store_write_root"]})  # its version's root: not this attempt's keys
    assert not any("evil" in p.name or p.name == "probe" for p in (home / "objects").rglob("*"))


def test_a_later_tenant_sees_nothing_of_an_earlier_one(stack: LiteStack, tmp_path: Any) -> None:
    svc = stack.services
    alice, _ = user(svc, "alice")
    bob, _ = user(svc, "bob")
    left = dag_probe(
        stack,
        alice,
        "alice_dag",
        """
jobs:
  leave:
    operator: leave_traces
    max_attempts: 1
    config: {value: alice-private-7, spark: true}
""",
    )
    assert left["status"] == "succeeded", left
    report = dag_probe(
        stack,
        bob,
        "bob_dag",
        """
jobs:
  look:
    operator: probe
    max_attempts: 1
    config:
      list: ["/tmp", "/dev/shm"]
      spark_sql:
        - "SELECT * FROM global_temp.left_behind"
        - "SELECT * FROM left_behind"
        - "SET spark.trace.left_behind"
        - "SELECT left_behind_fn()"
""",
    )
    assert "LEFT_BEHIND" not in report["env_keys"]
    assert "alice-private-7" not in json.dumps(report["list"])
    assert "left_behind" not in json.dumps(report["list"])
    spark = report["spark"]
    for q in ("SELECT * FROM global_temp.left_behind", "SELECT * FROM left_behind"):
        assert spark[q].startswith("refused"), spark
    assert "alice-private-7" not in json.dumps(spark)
    assert spark["SELECT left_behind_fn()"].startswith("refused"), spark


EVENT = {"dataset_uuid": "00000000-0000-4000-8000-000000000001", "cursor": "c"}


@pytest.mark.parametrize(
    ("config", "expect"),
    [
        ({"flood": 2000}, "broke the protocol"),
        ({"bigline_mb": 20}, "broke the protocol"),
        # Malformed ends and events: the attempt fails at once, not when its lease runs out.
        ({"send": [{"type": "done", "final_events": "not a list"}]}, "are lists"),
        ({"send": [{"type": "done", "final_events": [7]}]}, "EventIn: Input should be"),
        ({"send": [{"type": "done", "outputs": []}]}, "malformed 'done' message: KeyError"),
        ({"send": [{"type": "failed", "error": ["x"], "retryable": True}]}, "error is text"),
        ({"send": [{"type": "event", "event": {"no": "type"}}]}, "a malformed event"),
        ({"send": [{"type": "done", "final_events": [], "state": [1]}]}, "state is an object"),
        # A note only the wrapper posts (here with a long reason of the host's own), and an
        # exit while it runs on: refused as such.
        ({"send": [{"type": "protocol_error", "error": "x\n" * 30_000}]}, "only the wrapper"),
        ({"send": [{"type": "exit", "returncode": 0}]}, "only the wrapper posts"),
        # What a running task never says: refused at once, not ignored.
        ({"send": [{"type": "ready", "pid": 1}]}, "a message of unknown type 'ready'"),
        ({"send": [{"type": "store_reply", "ok": True}]}, "unknown type 'store_reply'"),
        # Valid, but nested deeper than the serializer goes: the event refused at once; the
        # end's report refused alone (the exchange it was in carried the others).
        (
            {"send": [{"type": "event", "event": {**EVENT, "payload": "NEST"}}], "nest": 300},
            "a malformed event",
        ),
        (
            {
                "send": [{"type": "done", "final_events": [{**EVENT, "payload": "NEST"}]}],
                "nest": 300,
                "then_exit": True,
            },
            "completion invalid",
        ),
    ],
)
def test_a_hostile_host_cannot_wedge_the_wrapper(
    stack: LiteStack, config: dict[str, Any], expect: str
) -> None:
    d = stack.services.dispatcher
    # The tenant's host runs first: the hostile task then lives in the worker's loop (a
    # host's first task of a tenant starts on its wrapper's thread).
    warm = d.create_task(TaskSpec(job="warm", operator="noop"))
    wait_for(lambda: d.get_task(warm.task_id).status == "succeeded", 60, "the host's start")
    ref = d.create_task(TaskSpec(job="hostile", operator="probe", config=config, max_attempts=1))
    view = wait_for(
        lambda: (v := d.get_task(ref.task_id)).status == "failed" and v, 60, "the refusal"
    )
    assert expect in (view.last_error or ""), view.last_error
    if (view.last_error or "").startswith("operator host broke the protocol"):
        assert "\n" not in (view.last_error or ""), view.last_error  # one line, bounded
    # The worker is still serving: the next task runs normally.
    ok = d.create_task(TaskSpec(job="after", operator="noop"))
    wait_for(lambda: d.get_task(ok.task_id).status == "succeeded", 60, "the next task")


def test_a_failure_longer_than_the_api_takes_is_cut_not_lost(stack: LiteStack) -> None:
    """The worker's loop reports it cut to the API's bound (it was refused, and the attempt
    waited for its lease to run out)."""
    d = stack.services.dispatcher
    spec = TaskSpec(
        job="long", operator="fail", config={"message": "x" * 30_000, "permanent": True}
    )
    ref = d.create_task(spec)
    view = wait_for(lambda: (v := d.get_task(ref.task_id)).status == "failed" and v, 60, "it")
    assert "more characters cut" in (view.last_error or ""), (view.last_error or "")[-200:]
    assert view.attempt == 1


def test_a_fifo_upload_is_refused_at_once(stack: LiteStack) -> None:
    report = dag_probe(
        stack,
        admin(stack.services),
        "fifo",
        """
jobs:
  look:
    operator: probe
    max_attempts: 1
    outputs: [{backend: parquet}]
    config: {fifo_upload: true}
""",
    )
    assert report["fifo_upload"].startswith("refused"), report["fifo_upload"]


def test_a_relative_trace_home_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make demo` runs with the default home `.trace`, relative to the project."""
    from trace_platform.sandbox import resolve
    from trace_platform.worker.operator_host import OperatorHost

    monkeypatch.chdir(tmp_path)
    settings = Settings(home=Path(".trace"), state_dsn="postgresql://unused/db")
    host = OperatorHost(settings.home, "relative", resolve(settings))
    try:
        host.ensure(("org", "dag"))
        assert host.proc is not None and host.proc.poll() is None
    finally:
        host.kill()
