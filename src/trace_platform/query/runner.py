"""A query worker: the process where user SQL runs, so a runaway query cannot hurt the API.

Started by the API process's WorkerPool (pool.py) as `python -m trace_platform.query.runner
REQ_FD RESP_FD`, in its own session, with a scrubbed environment and a private working
directory. It reads frames (wire.py) from REQ_FD and answers on RESP_FD:

1. an init frame: the least-privilege Postgres DSN, the S3 settings, the memory limit and the
   headroom. The worker loads the DuckDB extensions once, measures its own address space, and
   caps it with RLIMIT_AS at that baseline + memory limit + headroom (plus RLIMIT_CORE 0); then
   it answers `ready`.
2. one frame per query: the pinned plan (files and tables, resolved and read_roles-checked in
   the API process), the checked SQL, its parameters and limits. Before each query RLIMIT_CPU's
   soft limit is set to the CPU time used so far plus the query's CPU allowance (the kernel sends
   SIGXCPU, which ends the process); DuckDB's own memory_limit, threads and an interrupt at the
   time limit apply too, and the parent SIGKILLs the worker if no answer came by the time limit
   plus a grace period. The answer is Arrow IPC (or the encoded export) at most max_result_bytes
   long, or an error naming the limit that was hit.

DuckDB instances are cached per pin set as engine.Engine does. After a query that hit the memory
limit, or when the worker's resident size has grown well past its baseline, the worker asks to
be retired (`exit` in its answer) and exits; the pool starts a fresh one.
"""

from __future__ import annotations

import gc
import math
import os
import resource
import signal
import sys
import time
from typing import Any

import duckdb
import duckdb_extensions
import pyarrow as pa

from trace_platform.errors import TraceError
from trace_platform.query import formats, wire
from trace_platform.query.engine import Engine, Limits, S3Access, duck_message, run
from trace_platform.query.errors import LimitExceeded
from trace_platform.query.pins import Pin


def status_kib(field: str) -> int:
    """A `Vm…` line of /proc/self/status, in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _warm_up(s3: bool) -> None:
    """Loads what every instance will load, so the measured baseline includes it."""
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False})
    try:
        duckdb_extensions.import_extension("postgres_scanner", con=con)
        con.execute("LOAD postgres_scanner")
        if s3:
            duckdb_extensions.import_extension("httpfs", con=con)
            con.execute("LOAD httpfs")
        con.execute("SELECT 1").fetchall()
    finally:
        con.close()


def _can_raise_hard_limits() -> bool:
    """CAP_SYS_RESOURCE in the effective set (root in a container may lack it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> 24 & 1)
    return False


def _cpu_limit(seconds: float, raise_hard: bool) -> int:
    """Soft RLIMIT_CPU at the CPU time used so far plus this query's allowance (a worker's CPU
    time accumulates over its queries); the kernel sends SIGXCPU there, which ends the process.
    With CAP_SYS_RESOURCE the hard limit follows 2 s behind (SIGKILL even if SIGXCPU were
    ignored) and is raised again for the next query; without it, it is left where it is."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(ru.ru_utime + ru.ru_stime + seconds)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if raise_hard:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 2))
    elif hard == resource.RLIM_INFINITY or soft <= hard:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    else:
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
    return soft


def _encode(table: pa.Table, fmt: str) -> pa.Buffer | bytes:
    if fmt == "arrow":
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue()
    return formats.encode(table, fmt)


class Worker:
    def __init__(self, init: dict[str, Any]) -> None:
        s3 = init.get("s3")
        self.engine = Engine(
            str(init["pg_dsn"]),
            S3Access(**s3) if s3 else None,
            cache_size=int(init["cache_size"]),
        )
        self.memory_bytes = int(init["memory_limit_bytes"])
        self.raise_hard = _can_raise_hard_limits()
        _warm_up(bool(s3))
        self.baseline_kib = status_kib("VmSize")
        self.as_limit = self.baseline_kib * 1024 + self.memory_bytes + int(init["headroom_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (self.as_limit, self.as_limit))
        self.ready_rss_kib = status_kib("VmRSS")

    def handle(self, req: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        fmt = str(req.get("format", "arrow"))
        export = bool(req["export"])
        limits = Limits(**req["limits"])
        t0 = time.perf_counter()
        try:
            cpu_soft = _cpu_limit(float(req["cpu_seconds"]), self.raise_hard)
            pins = {p["name"]: Pin.from_json(p) for p in req["pins"]}
            with self.engine.cursor(pins, limits) as cur:
                table = run(cur, req["sql"], req.get("params") or None, limits, export=export)
            payload = _encode(table, fmt)
            size = memoryview(payload).nbytes
            if size > limits.max_result_bytes:  # e.g. a CSV export larger than its Arrow table
                raise LimitExceeded.hit("max_result_bytes", limits.max_result_bytes, export=export)
            header = {
                "ok": True,
                "rows": table.num_rows,
                "bytes": size,
                "cpu_soft": cpu_soft,
                "ms": round((time.perf_counter() - t0) * 1000, 3),
            }
            del table
            return header, payload
        except LimitExceeded as e:
            limit = e.detail.get("limit")
            return {
                "ok": False,
                "kind": "limit",
                "limit": limit,
                "value": e.detail.get("value"),
                "exit": limit == "memory_limit",
            }, b""
        except MemoryError:
            return {
                "ok": False,
                "kind": "limit",
                "limit": "memory_limit",
                "value": limits.memory_limit,
                "exit": True,
            }, b""
        except duckdb.Error as e:
            return {"ok": False, "kind": "query_failed", "message": duck_message(e)}, b""
        except TraceError as e:
            return {
                "ok": False,
                "kind": "invalid",
                "code": e.code,
                "status": e.status_code,
                "message": e.message,
            }, b""
        except Exception as e:
            return {
                "ok": False,
                "kind": "internal",
                "message": f"{type(e).__name__}: {e}",
                "exit": True,
            }, b""

    def too_big(self, answer_bytes: int) -> bool:
        """Whether the worker holds too much between queries (besides the answer it is about to
        send): cached instances are dropped first; if that is not enough, it asks to be
        retired."""
        budget = self.ready_rss_kib + (self.memory_bytes // 2 + answer_bytes) // 1024
        if status_kib("VmRSS") <= budget:
            return False
        self.engine.close()
        gc.collect()
        return status_kib("VmRSS") > budget


def main(argv: list[str]) -> int:
    req_fd, resp_fd = int(argv[0]), int(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the pool stops workers, not a terminal ^C
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        init, _ = wire.recv(req_fd)
    except wire.Closed:
        return 0
    try:
        worker = Worker(init)
    except Exception as e:
        wire.send(resp_fd, {"ready": False, "message": f"{type(e).__name__}: {e}"})
        return 1
    wire.send(
        resp_fd,
        {
            "ready": True,
            "pid": os.getpid(),
            "as_limit": worker.as_limit,
            "baseline_kib": worker.baseline_kib,
        },
    )
    while True:
        try:
            req, _ = wire.recv(req_fd)
        except wire.Closed:
            return 0
        header, payload = worker.handle(req)
        if not header.get("exit") and worker.too_big(memoryview(payload).nbytes):
            header["exit"] = True
        try:
            wire.send(resp_fd, header, payload)
        except BrokenPipeError:
            return 0
        del payload
        if header.get("exit"):
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
