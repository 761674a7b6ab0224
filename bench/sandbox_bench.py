"""What operator isolation costs, measured side by side in one run on this machine.

1. No-op tasks end to end through the Lite stack (one worker, one wrapper), sandbox off vs on:
   the per-task overhead of the per-task scratch directories, the scoped store and the egress
   checks (the sandboxed host is started once and reused within a tenant).
2. Host start per tenant: no-op tasks of two DAGs alternating one at a time, so every task
   starts a fresh host (sandbox off vs on: namespaces, mounts, the user switch).
3. Spark task start with the JVM policy (one host and JVM per tenant, a fresh Spark session per
   task): a Spark task right after another tenant ran (host and JVM start: a tenant's first
   Spark task always comes with a fresh host, sandbox on or off) and the next task of the
   same tenant (new session only).

Each row counts only its own tasks, checks they all succeeded, and checks (with the `probe`
operator) which user the operators really ran as. Needs root for the sandboxed rows.
Run: `.venv/bin/python bench/sandbox_bench.py [--tasks 200]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from typing import Any

import smoke  # this folder's: run as a script
from embedded_pg import migrated_postgres  # this folder's: run as a script
from trace_platform.config import Settings
from trace_platform.contract import TaskSpec
from trace_platform.identity import lite_admin
from trace_platform.lite.stack import LiteStack
from trace_platform.operators.testing import probe_report

TERMINAL = ("succeeded", "failed", "canceled")


def wait_done(stack: LiteStack, ids: list[uuid.UUID], timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with stack.services.pool.connection() as conn:
            rows = conn.execute(
                "SELECT status, last_error FROM task_status WHERE task_id = ANY(%s)", (ids,)
            ).fetchall()
        if len(rows) == len(ids) and all(r["status"] in TERMINAL for r in rows):
            bad = [r for r in rows if r["status"] != "succeeded"]
            if bad:
                raise SystemExit(f"refusing to print: {len(bad)} task(s) did not succeed: {bad[0]}")
            return
        time.sleep(0.01)
    raise SystemExit("refusing to print: tasks did not finish in time")


def ran_as(stack: LiteStack) -> int:
    """The uid operators run as in this stack (the probe reports it in its failure)."""
    d = stack.services.dispatcher
    ref = d.create_task(TaskSpec(job="probe", operator="probe", max_attempts=1))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        v = d.get_task(ref.task_id)
        if v.status in TERMINAL:
            report = probe_report(v.last_error or "")
            if report is None:
                raise SystemExit(f"probe did not report: {v.status} {v.last_error}")
            return int(report["uid"])
        time.sleep(0.05)
    raise SystemExit("probe did not finish")


def noop_throughput(stack: LiteStack, n: int, warmup: bool = True) -> float:
    d = stack.services.dispatcher
    job = f"bench_{uuid.uuid4().hex[:8]}"
    if warmup:
        warm = d.create_task(TaskSpec(job=job + "_warm", operator="noop")).task_id
        wait_done(stack, [warm])  # the host is up before the clock starts
    t0 = time.perf_counter()
    with stack.services.pool.connection() as conn, conn.transaction():
        ids = [d.create_task(TaskSpec(job=job, operator="noop"), conn).task_id for _ in range(n)]
    wait_done(stack, ids)
    return (time.perf_counter() - t0) / n * 1000


def deploy_tenants(stack: LiteStack, operator: str) -> tuple[str, str]:
    """Two DAGs (two tenants) of one `operator` job each, deployed once (a DAG deployed again
    with another operator would be a change: its triggers would start both versions' jobs)."""
    svc = stack.services
    with svc.pool.connection() as conn:
        admin = lite_admin(conn)
    names = (f"{operator}_a", f"{operator}_b")
    for name in names:
        svc.control.deploy(admin, f"name: {name}\njobs:\n  j: {{operator: {operator}}}\n")
    return names


def one_run(stack: LiteStack, dag: str) -> float:
    """Seconds from trigger to success of one task of `dag`, with nothing else running."""
    svc = stack.services
    with svc.pool.connection() as conn:
        admin = lite_admin(conn)
    t0 = time.perf_counter()
    (task,) = svc.control.trigger(admin, dag)["tasks"]
    wait_done(stack, [task])
    return time.perf_counter() - t0


def alternating(stack: LiteStack, n: int, warmup: bool = True) -> float:
    a, b = deploy_tenants(stack, "noop")
    if warmup:  # so that the first timed run is a switch too
        one_run(stack, a)
    times = [one_run(stack, b if i % 2 == 0 else a) for i in range(n)]
    return statistics.median(times) * 1000


SPARK_ROWS = ("after another tenant (host + JVM start)", "next of the same tenant (session only)")


def spark_starts(stack: LiteStack, runs: int, warmup: bool = True) -> dict[str, list[float]]:
    a, b = deploy_tenants(stack, "spark_ping")
    if warmup:
        one_run(stack, b)  # untimed: whatever host ran before, the first pair is a switch
    switch, same = SPARK_ROWS
    out: dict[str, list[float]] = {switch: [], same: []}
    for i in range(runs):
        dag = (a, b)[i % 2]  # each pair's tenant differs from the last pair's
        out[switch].append(one_run(stack, dag))
        out[same].append(one_run(stack, dag))
    return out


def stack_for(settings: Settings, dsn: str, sandbox: str) -> LiteStack:
    return LiteStack(settings, workers=1, dsn=dsn, worker_env={"TRACE_SANDBOX": sandbox})


def main() -> None:
    os.environ["TRACE_OPERATOR_REGISTRY"] = "testing"  # noop, probe, spark_ping
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--switches", type=int, default=10)
    ap.add_argument("--spark-runs", type=int, default=3)
    ap.add_argument(
        "--no-spark-warmup",
        dest="spark_warmup",
        action="store_false",
        help="no untimed Spark task first (its host and JVM start)",
    )
    # Smoke size: every row once and no warm-up task (a host start falls in a timed run: no
    # figure is printed), both sandbox settings, the user check.
    args = smoke.parse_args(ap, tasks=5, switches=1, spark_runs=1, spark_warmup=False)
    if os.geteuid() != 0:
        raise SystemExit("the sandboxed rows need root (the sandbox switches users)")
    results: dict[str, Any] = {}
    with migrated_postgres("trace-sandbox-bench-") as (root, dsn):
        print(f"machine: {os.cpu_count()} cores; one worker, one wrapper; fsync on")
        for sandbox in ("off", "auto"):
            settings = Settings(state_dsn=dsn, home=root / f"home-{sandbox}", auth="permissive")
            with stack_for(settings, dsn, sandbox) as stack:
                uid = ran_as(stack)
                if (uid == 0) != (sandbox == "off"):
                    raise SystemExit(f"refusing to print: sandbox={sandbox} ran as uid {uid}")
                results[sandbox] = {
                    "uid": uid,
                    "noop_ms": noop_throughput(stack, args.tasks, not args.smoke),
                    "switch_ms": alternating(stack, args.switches, not args.smoke),
                    "spark": spark_starts(stack, args.spark_runs, args.spark_warmup),
                }
        off, on = results["off"], results["auto"]
        print(f"\n{'':72}{'sandbox off':>14}{'sandbox on':>14}{'ratio':>8}")
        rows = [
            (f"no-op task, end to end (n={args.tasks})", off["noop_ms"], on["noop_ms"], "ms/task"),
            (
                f"no-op task on a tenant switch (host start; median of {args.switches})",
                off["switch_ms"],
                on["switch_ms"],
                "ms/task",
            ),
        ]
        for label in SPARK_ROWS:
            rows.append(
                (
                    f"Spark task, {label} (median of {args.spark_runs})",
                    statistics.median(off["spark"][label]) * 1000,
                    statistics.median(on["spark"][label]) * 1000,
                    "ms",
                )
            )
        for label, a, b, unit in rows:
            print(f"{label:72}{a:11.1f} {unit:<3}{b:10.1f} {unit:<3}{b / a:7.2f}x")
        print(f"\noperators ran as uid {off['uid']} (off) and uid {on['uid']} (sandbox user)")


if __name__ == "__main__":
    smoke.main(main)
