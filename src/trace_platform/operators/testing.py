"""Test operators: loaded only with TRACE_OPERATOR_REGISTRY=testing, which the aws profile
refuses. They write files, record env values, emit arbitrary events, kill their own process,
or probe the sandbox: useful to test the platform, never something a shared install offers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from trace_platform.dispatcher.models import EventIn
from trace_platform.operators.context import OperatorContext, OperatorError, PermanentError


def noop(ctx: OperatorContext) -> None:
    """config: record_to (a file path: appends "task_id attempt", so a run can be counted) and
    record_env (names of the task's env vars whose values are appended too)."""
    ctx.log.info("noop task %s attempt %s", ctx.task.task_id, ctx.task.attempt)
    if path := ctx.config.get("record_to"):
        env = " ".join(f"{k}={ctx.env.get(k, '')}" for k in ctx.config.get("record_env", []))
        with open(path, "a") as f:
            f.write(f"{ctx.task.task_id} {ctx.task.attempt} {env}".rstrip() + "\n")


def fail(ctx: OperatorContext) -> None:
    """config: message, permanent (bool), succeed_on_attempt (int: fail before it, then succeed)."""
    succeed_on = ctx.config.get("succeed_on_attempt")
    if succeed_on is not None and ctx.task.attempt >= int(succeed_on):
        return
    message = str(ctx.config.get("message", "asked to fail"))
    if ctx.config.get("permanent"):
        raise PermanentError(message)
    raise OperatorError(message)


def crash(ctx: OperatorContext) -> None:
    """Kills its own process, as a segfaulting native library would."""
    os.kill(os.getpid(), signal.SIGKILL)


def emit_events(ctx: OperatorContext) -> list[EventIn]:
    """config: dataset_uuid (default: the task's first output), count, final (how many of them are
    bundled with the completion instead of sent mid-task), sleep between events."""
    default = (
        ctx.task.outputs[0].dataset_uuid
        if ctx.task.outputs
        else uuid.uuid5(uuid.NAMESPACE_URL, ctx.task.job)
    )
    dataset = uuid.UUID(str(ctx.config.get("dataset_uuid") or default))
    count = int(ctx.config.get("count", 3))
    final = int(ctx.config.get("final", 1))
    pause = float(ctx.config.get("sleep", 0))
    events = [EventIn(dataset_uuid=dataset, cursor=str(i), payload={"n": i}) for i in range(count)]
    for ev in events[: count - final]:
        ctx.emit(ev)
        time.sleep(pause)
    return events[count - final :]


def spark_ping(ctx: OperatorContext) -> None:
    """One trivial Spark SQL query on the task's own session (measures Spark start cost)."""
    rows = ctx.spark.sql("SELECT 1 AS one").collect()
    if rows[0][0] != 1:
        raise OperatorError(f"Spark answered {rows}")


def leave_traces(ctx: OperatorContext) -> None:
    """Leaves what a careless or hostile task could leave behind for the next one: env vars,
    files in HOME, TMPDIR, /tmp and /dev/shm, and Spark state (views, conf, cache, a function).
    config: value (what to leave), spark (bool)."""
    value = str(ctx.config.get("value") or ctx.env.get("SECRET", "trace"))
    os.environ["LEFT_BEHIND"] = value
    for d in (os.environ.get("HOME", "."), os.environ.get("TMPDIR", "."), "/tmp", "/dev/shm"):
        with contextlib.suppress(OSError):
            Path(d, "left_behind.txt").write_text(value)
    if ctx.config.get("spark"):
        spark = ctx.spark
        spark.sql(f"SELECT '{value}' AS v").createOrReplaceTempView("left_behind")
        spark.sql(f"SELECT '{value}' AS v").createOrReplaceGlobalTempView("left_behind")
        spark.sql(f"SET spark.trace.left_behind={value}")
        spark.sql("CACHE TABLE left_behind")
        spark.udf.register("left_behind_fn", lambda: value)


def _attempt(fn: Any) -> str:
    try:
        out = fn()
    except Exception as e:
        return f"refused: {type(e).__name__}: {e}"[:300]
    return f"ALLOWED: {str(out)[:200]}"


def _connect(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=2) as s:
        return f"connected to {s.getpeername()}"


def probe(ctx: OperatorContext) -> None:
    """Tries what an attacker would, and reports each outcome as its failure message (JSON).
    config: read (file paths), environ_pids (pids whose /proc/<pid>/environ to read), connect
    (["host", port] pairs), list (directories), write (file paths), env (names to report)."""
    c = ctx.config
    report: dict[str, Any] = {
        "uid": os.getuid(),
        "cwd": os.getcwd(),
        "cwd_entries": sorted(os.listdir(".")),
        "env_keys": sorted(os.environ),
        "task_env": {k: ctx.env.get(k) for k in c.get("env", [])},
        "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    }
    report["read"] = {p: _attempt(lambda p=p: Path(p).read_text()[:40]) for p in c.get("read", [])}
    report["environ"] = {
        str(pid): _attempt(lambda pid=pid: Path(f"/proc/{pid}/environ").read_bytes()[:40])
        for pid in c.get("environ_pids", [])
    }
    report["connect"] = {
        f"{h}:{p}": _attempt(lambda h=h, p=p: _connect(h, int(p))) for h, p in c.get("connect", [])
    }
    report["list"] = {d: _attempt(lambda d=d: sorted(os.listdir(d))) for d in c.get("list", [])}
    report["write"] = {
        p: _attempt(lambda p=p: Path(p).write_text("probe")) for p in c.get("write", [])
    }
    if c.get("store_read"):
        report["store_read"] = {
            k: _attempt(lambda k=k: ctx.store.get(k)[:20]) for k in c["store_read"]
        }
    if c.get("store_write"):
        report["store_write"] = {
            k: _attempt(lambda k=k: ctx.store.put(k, b"probe")) for k in c["store_write"]
        }
    if c.get("store_write_own"):
        own = ctx.task.outputs[0].location if ctx.task.outputs else "nowhere/"
        report["store_write_own"] = _attempt(lambda: ctx.store.put(f"{own}own.txt", b"ok"))
    if c.get("upload_paths"):
        out = ctx.task.outputs[0].location if ctx.task.outputs else "nowhere/"
        report["upload"] = {}
        for i, p in enumerate(c["upload_paths"]):
            path = Path(p)
            if p.startswith("link:"):  # a symlink in the scratch dir pointing at the target
                path = Path.cwd() / f"link_{i}"
                path.symlink_to(p.removeprefix("link:"))
            report["upload"][p] = _attempt(
                lambda path=path: ctx.store.put_file(f"{out}probe", path)
            )
    if c.get("fifo_upload"):
        out = ctx.task.outputs[0].location if ctx.task.outputs else "nowhere/"
        fifo = Path.cwd() / "fifo"
        os.mkfifo(fifo)
        report["fifo_upload"] = _attempt(lambda: ctx.store.put_file(f"{out}fifo", fifo))
    if c.get("flood"):  # store requests without ever reading a reply
        for _ in range(int(c["flood"])):
            ctx._send({"type": "store", "op": "list", "key": ""})
        time.sleep(60)
    if c.get("bigline_mb"):  # one message far over the protocol's line limit
        ctx._send({"type": "progress", "pad": "x" * (int(c["bigline_mb"]) << 20)})
        time.sleep(60)
    if c.get("rpc_env"):
        import httpx

        body = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}
        report["rpc"] = {
            k: _attempt(lambda k=k: httpx.post(ctx.env[k], json=body, timeout=5).json())
            for k in c["rpc_env"]
        }
    if c.get("spark_sql"):
        report["spark"] = {
            q: _attempt(lambda q=q: [tuple(r) for r in ctx.spark.sql(q).collect()][:3])
            for q in c["spark_sql"]
        }
    raise PermanentError("PROBE " + json.dumps(report))
