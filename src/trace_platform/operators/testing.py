"""Test operators: loaded only with TRACE_OPERATOR_REGISTRY=testing, which the aws profile
refuses. They write files, record env values, emit arbitrary events, kill their own process,
or probe the sandbox: useful to test the platform, never something a shared install offers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Self

from pydantic import ConfigDict, Field, model_validator

from trace_platform.contract import EventIn
from trace_platform.operators.config import OperatorConfig
from trace_platform.operators.context import OperatorContext, OperatorError, PermanentError
from trace_platform.operators.output import attempt_prefix


class NoopConfig(OperatorConfig):
    """Any other key is accepted (and ignored), so a test can change a job's materialization."""

    model_config = ConfigDict(extra="allow")

    record_to: str | None = None
    record_env: list[str] = Field(default_factory=list)
    progress: int = Field(default=0, ge=0, le=100_000)


def noop(ctx: OperatorContext) -> None:
    """config: record_to (a file path: appends "task_id attempt", so a run can be counted),
    record_env (names of the task's env vars whose values are appended too) and progress (how
    many progress reports it sends first)."""
    cfg = NoopConfig.from_ctx(ctx)
    for n in range(cfg.progress):
        ctx.progress(n=n)
    ctx.log.info("noop task %s attempt %s", ctx.task.task_id, ctx.task.attempt)
    if path := cfg.record_to:
        env = " ".join(f"{k}={ctx.env.get(k, '')}" for k in cfg.record_env)
        with open(path, "a") as f:
            f.write(f"{ctx.task.task_id} {ctx.task.attempt} {env}".rstrip() + "\n")


class FailConfig(OperatorConfig):
    message: str = "asked to fail"
    permanent: bool = False
    succeed_on_attempt: int | None = Field(default=None, ge=1)


def fail(ctx: OperatorContext) -> None:
    """config: message, permanent (bool), succeed_on_attempt (int: fail before it, then succeed)."""
    cfg = FailConfig.from_ctx(ctx)
    if cfg.succeed_on_attempt is not None and ctx.task.attempt >= cfg.succeed_on_attempt:
        return
    if cfg.permanent:
        raise PermanentError(cfg.message)
    raise OperatorError(cfg.message)


class NoConfig(OperatorConfig):
    """An operator without settings: any key is a mistake."""


def crash(ctx: OperatorContext) -> None:
    """Kills its own process, as a segfaulting native library would."""
    NoConfig.from_ctx(ctx)
    os.kill(os.getpid(), signal.SIGKILL)


class EmitEventsConfig(OperatorConfig):
    dataset_uuid: uuid.UUID | None = None
    count: int = Field(default=3, ge=0, le=1_000_000)
    final: int = Field(default=1, ge=0)
    sleep: float = Field(default=0, ge=0, le=3600)

    @model_validator(mode="after")
    def _final_within_count(self) -> Self:
        if self.final > self.count:
            raise ValueError(f"final ({self.final}) cannot exceed count ({self.count})")
        return self


def emit_events(ctx: OperatorContext) -> list[EventIn]:
    """config: dataset_uuid (default: the task's first output), count, final (how many of them are
    bundled with the completion instead of sent mid-task), sleep between events."""
    cfg = EmitEventsConfig.from_ctx(ctx)
    default = (
        ctx.task.outputs[0].dataset_uuid
        if ctx.task.outputs
        else uuid.uuid5(uuid.NAMESPACE_URL, ctx.task.job)
    )
    dataset = cfg.dataset_uuid or default
    count, final, pause = cfg.count, cfg.final, cfg.sleep
    events = [EventIn(dataset_uuid=dataset, cursor=str(i), payload={"n": i}) for i in range(count)]
    for ev in events[: count - final]:
        ctx.emit(ev)
        time.sleep(pause)
    return events[count - final :]


class PublishRowsConfig(OperatorConfig):
    dataset: str = Field(description="the buffered dataset to publish to")
    batches: list[list[dict[str, Any]]] = Field(
        default_factory=list, description="each list of rows one JSONL batch"
    )


def publish_rows(ctx: OperatorContext) -> None:
    """Publishes batches of rows to a buffered dataset (each written under the attempt's
    buffer prefix, published by the wrapper). config: dataset, batches."""
    cfg = PublishRowsConfig.from_ctx(ctx)
    for rows in cfg.batches:
        ctx.publish_rows(cfg.dataset, rows)


def spark_ping(ctx: OperatorContext) -> None:
    """One trivial Spark SQL query on the task's own session (measures Spark start cost)."""
    NoConfig.from_ctx(ctx)
    rows = ctx.spark.sql("SELECT 1 AS one").collect()
    if rows[0][0] != 1:
        raise OperatorError(f"Spark answered {rows}")


class LeaveTracesConfig(OperatorConfig):
    value: str | None = None
    spark: bool = False


def leave_traces(ctx: OperatorContext) -> None:
    """Leaves what a careless or hostile task could leave behind for the next one: env vars,
    files in HOME, TMPDIR, /tmp and /dev/shm, and Spark state (views, conf, cache, a function).
    config: value (what to leave), spark (bool)."""
    cfg = LeaveTracesConfig.from_ctx(ctx)
    value = cfg.value or ctx.env.get("SECRET", "trace")
    os.environ["LEFT_BEHIND"] = value
    for d in (os.environ.get("HOME", "."), os.environ.get("TMPDIR", "."), "/tmp", "/dev/shm"):
        with contextlib.suppress(OSError):
            Path(d, "left_behind.txt").write_text(value)
    if cfg.spark:
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


class ProbeConfig(OperatorConfig):
    read: list[str] = Field(default_factory=list)
    environ_pids: list[int] = Field(default_factory=list)
    connect: list[tuple[str, int]] = Field(default_factory=list)
    list_: list[str] = Field(default_factory=list, alias="list")
    write: list[str] = Field(default_factory=list)
    env: list[str] = Field(default_factory=list)
    store_read: list[str] = Field(default_factory=list)
    store_write: list[str] = Field(default_factory=list)
    store_write_own: bool = False
    upload_paths: list[str] = Field(default_factory=list)
    fifo_upload: bool = False
    flood: int = Field(default=0, ge=0)
    bigline_mb: int = Field(default=0, ge=0)
    # Messages sent to the wrapper as they are (a malformed end, say), before a minute's wait
    # (or, `then_exit`, the host's exit); each "NEST" string in them becomes an object nested
    # `nest` deep.
    send: list[dict[str, Any]] = Field(default_factory=list)
    nest: int = Field(default=0, ge=0, le=10_000)
    then_exit: bool = False
    # With `then_exit`: the exit waits (up to a minute) for this file to exist, so a test
    # orders it after what the wrapper does next.
    exit_when: str | None = None
    # Messages a thread the task leaves running sends `linger_after` seconds after its start,
    # when the host may run the tenant's next task.
    linger: list[dict[str, Any]] = Field(default_factory=list)
    linger_after: float = Field(default=1.0, ge=0, le=60)
    # Reads its own fd 0 directly (as input() would), without waiting: what is there now.
    stdin: bool = False
    rpc_env: list[str] = Field(default_factory=list)
    spark_sql: list[str] = Field(default_factory=list)
    # The host's resource limits (rlimits, cgroup), and an allocation of this many MiB.
    limits: bool = False
    allocate_mb: int = Field(default=0, ge=0, le=1 << 20)


PROBE = "PROBE "


def _nested(value: Any, depth: int) -> Any:
    """`value` with each "NEST" string replaced by an object nested `depth` deep."""
    if value == "NEST":
        deep: dict[str, Any] = {}
        for _ in range(depth):
            deep = {"a": deep}
        return deep
    if isinstance(value, dict):
        return {k: _nested(v, depth) for k, v in value.items()}
    if isinstance(value, list):
        return [_nested(v, depth) for v in value]
    return value


def probe_report(error: str) -> dict[str, Any] | None:
    """The report in a probe task's failure message, or None if the probe never reported: the
    JSON object after "PROBE ", whatever the host appended after it (" (at file:line)")."""
    start = error.find(PROBE)
    if start < 0:
        return None
    report, _ = json.JSONDecoder().raw_decode(error, start + len(PROBE))
    return dict(report)


def _linger(ctx: OperatorContext, c: ProbeConfig) -> None:
    time.sleep(c.linger_after)
    for raw in c.linger:
        ctx._send(raw)


def probe(ctx: OperatorContext) -> None:
    """Tries what an attacker would, and reports each outcome as its failure message (JSON, read
    back with `probe_report`).
    config: read (file paths), environ_pids (pids whose /proc/<pid>/environ to read), connect
    (["host", port] pairs), list (directories), write (file paths), env (names to report)."""
    c = ProbeConfig.from_ctx(ctx)
    if c.linger:
        threading.Thread(target=_linger, args=(ctx, c), daemon=True).start()
    report: dict[str, Any] = {
        "uid": os.getuid(),
        "cwd": os.getcwd(),
        "cwd_entries": sorted(os.listdir(".")),
        "env_keys": sorted(os.environ),
        "task_env": {k: ctx.env.get(k) for k in c.env},
        "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    }
    report["read"] = {p: _attempt(lambda p=p: Path(p).read_text()[:40]) for p in c.read}
    report["environ"] = {
        str(pid): _attempt(lambda pid=pid: Path(f"/proc/{pid}/environ").read_bytes()[:40])
        for pid in c.environ_pids
    }
    report["connect"] = {
        f"{h}:{p}": _attempt(lambda h=h, p=p: _connect(h, int(p))) for h, p in c.connect
    }
    report["list"] = {d: _attempt(lambda d=d: sorted(os.listdir(d))) for d in c.list_}
    report["write"] = {p: _attempt(lambda p=p: Path(p).write_text("probe")) for p in c.write}
    if c.stdin:
        os.set_blocking(0, False)
        report["stdin"] = _attempt(lambda: os.read(0, 4096))
    if c.store_read:
        report["store_read"] = {
            k: _attempt(lambda k=k: ctx.store.get(k)[:20]) for k in c.store_read
        }
    if c.store_write:
        report["store_write"] = {
            k: _attempt(lambda k=k: ctx.store.put(k, b"probe")) for k in c.store_write
        }
    if c.store_write_own:  # its own keys (allowed), and its version's root (not its own)
        root = ctx.task.outputs[0].location if ctx.task.outputs else "nowhere/"
        own = attempt_prefix(root, ctx.task)
        report["store_write_own"] = _attempt(lambda: ctx.store.put(f"{own}own.txt", b"ok"))
        report["store_write_root"] = _attempt(lambda: ctx.store.put(f"{root}root.txt", b"x"))
    if c.upload_paths:
        out = (
            attempt_prefix(ctx.task.outputs[0].location or "", ctx.task)
            if ctx.task.outputs
            else "nowhere/"
        )
        report["upload"] = {}
        for i, p in enumerate(c.upload_paths):
            path = Path(p)
            if p.startswith("link:"):  # a symlink in the scratch dir pointing at the target
                path = Path.cwd() / f"link_{i}"
                path.symlink_to(p.removeprefix("link:"))
            report["upload"][p] = _attempt(
                lambda path=path: ctx.store.put_file(f"{out}probe", path)
            )
    if c.fifo_upload:
        out = (
            attempt_prefix(ctx.task.outputs[0].location or "", ctx.task)
            if ctx.task.outputs
            else "nowhere/"
        )
        fifo = Path.cwd() / "fifo"
        os.mkfifo(fifo)
        report["fifo_upload"] = _attempt(lambda: ctx.store.put_file(f"{out}fifo", fifo))
    if c.flood:  # store requests without ever reading a reply
        for _ in range(c.flood):
            ctx._send({"type": "store", "op": "list", "key": ""})
        time.sleep(60)
    if c.bigline_mb:  # one message far over the protocol's line limit
        ctx._send({"type": "progress", "pad": "x" * (c.bigline_mb << 20)})
        time.sleep(60)
    if c.send:
        for raw in c.send:
            ctx._send(_nested(raw, c.nest))
        if c.then_exit:  # a well-formed end the host does not follow with its own
            until = time.monotonic() + 60
            while c.exit_when and not os.path.exists(c.exit_when) and time.monotonic() < until:
                time.sleep(0.01)
            os._exit(0)
        time.sleep(60)
    if c.rpc_env:
        import httpx

        body = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}
        report["rpc"] = {
            k: _attempt(lambda k=k: httpx.post(ctx.env[k], json=body, timeout=5).json())
            for k in c.rpc_env
        }
    if c.limits:
        import resource

        report["limits"] = {
            name: resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))[0]
            for name in ("AS", "DATA", "NPROC", "NOFILE")
        }
        report["limits"]["cgroup"] = Path("/proc/self/cgroup").read_text()
    if c.allocate_mb:
        report["allocate"] = _attempt(lambda: len(bytearray(c.allocate_mb << 20)))
    if c.spark_sql:
        report["spark"] = {
            q: _attempt(lambda q=q: [tuple(r) for r in ctx.spark.sql(q).collect()][:3])
            for q in c.spark_sql
        }
    raise PermanentError(PROBE + json.dumps(report))
