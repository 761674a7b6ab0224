"""Dispatcher latency and throughput on this machine (issue 3's figures).

1. trigger -> running: from the HTTP trigger request (taken just before it is sent) until its
   task's attempt starts, for a one-job DAG on a warm worker (sequential runs, so the worker is
   idle and waiting on LISTEN/NOTIFY).
2. upstream commit -> downstream running: the source task's completion commit (with its final
   event) until the downstream task's attempt starts.
3. throughput of no-op tasks through the full lifecycle: (a) the Dispatcher core in-process
   (create -> outbox -> queue -> claim -> complete -> ack, batched, several threads), and (b)
   end to end through the Lite stack with real worker processes (HTTP internal API, operator
   host), 2 workers x 1, 4, 8 and 32 wrappers (`--workers`, `--wrappers`; `--repeat` rows
   each). Under each end-to-end row: the CPU per task of each role (the API, in this process
   with the bench's polling; Postgres; the workers; their operator hosts) and the machine's
   context switches per task, over the row.

Latencies end on Postgres's `now()` of the claiming transaction; they start at the HTTP request
(this machine's wall clock, the server's too) or at the upstream completion's `now()`. Every
throughput row counts only its own tasks (by id, on a queue of its own for the core rows) and
refuses to print unless every one of them succeeded.
Run: `.venv/bin/python bench/dispatch_bench.py [--runs 500]`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import smoke  # this folder's: run as a script
from trace_platform.config import Settings
from trace_platform.contract import ClaimRequest, CompleteRequest, TaskSpec
from trace_platform.db.embedded import EmbeddedPostgres
from trace_platform.db.migrate import migrate
from trace_platform.errors import Conflict
from trace_platform.identity import lite_admin
from trace_platform.lite.stack import LiteStack
from trace_platform.services import Services

ONE_JOB = "name: one\njobs:\n  a: {operator: noop}\n"
TWO_JOBS = (
    "name: two\njobs:\n"
    "  up: {operator: emit_events, config: {count: 1, final: 1}, outputs: [{}]}\n"
    "  down: {operator: noop, inputs: [{job: up, output: 0}]}\n"
)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def fmt(values: list[float]) -> str:
    return (
        f"p50 {pct(values, 50):7.2f} ms   p95 {pct(values, 95):7.2f} ms   "
        f"p99 {pct(values, 99):7.2f} ms   (n={len(values)})"
    )


def wait_for(check: Any, timeout: float = 60, every: float = 0.002) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if v := check():
            return v
        time.sleep(every)
    raise TimeoutError("bench step timed out")


def trigger_to_running(stack: LiteStack, runs: int, warmup: int = 10) -> list[float]:
    svc = stack.services
    with svc.pool.connection() as conn:
        admin = lite_admin(conn)
    svc.control.deploy(admin, ONE_JOB)
    out: list[float] = []
    with httpx.Client(base_url=stack.url) as http:
        for i in range(runs + warmup):
            sent = time.time()  # the request's start: the same machine's clock as the server's
            r = http.post("/v1/dags/one/trigger")
            run_id = r.json()["run_id"]

            def started(run_id: str = run_id) -> Any:
                with svc.pool.connection() as conn:
                    return conn.execute(
                        """SELECT extract(epoch FROM a.started_at) AS started
                           FROM trigger_fires f JOIN task_registry r ON r.run_id = f.run_id
                           JOIN task_attempts a ON a.task_id = r.task_id AND a.attempt = 1
                           JOIN task_status s ON s.task_id = r.task_id AND s.status = 'succeeded'
                           WHERE f.run_id = %s""",
                        (run_id,),
                    ).fetchone()

            row = wait_for(started)
            if i >= warmup:  # the first runs warm the worker, the pool and the caches
                out.append((float(row["started"]) - sent) * 1000)
    return out


def commit_to_downstream(stack: LiteStack, runs: int, warmup: int = 10) -> list[float]:
    svc = stack.services
    with svc.pool.connection() as conn:
        admin = lite_admin(conn)
    svc.control.deploy(admin, TWO_JOBS)
    out: list[float] = []
    for i in range(runs + warmup):
        run_id = svc.control.trigger(admin, "two")["run_id"]

        def started(run_id: uuid.UUID = run_id) -> Any:
            with svc.pool.connection() as conn:
                return conn.execute(
                    """SELECT extract(epoch FROM a.started_at - us.finished_at) * 1000 AS ms
                       FROM task_registry u JOIN task_status us ON us.task_id = u.task_id
                       JOIN task_registry d ON d.parent_task_id = u.task_id
                       JOIN task_attempts a ON a.task_id = d.task_id AND a.attempt = 1
                       JOIN task_status ds ON ds.task_id = d.task_id AND ds.status = 'succeeded'
                       WHERE u.run_id = %s AND u.job = 'up'""",
                    (run_id,),
                ).fetchone()

        row = wait_for(started)
        if i >= warmup:
            out.append(float(row["ms"]))
    return out


def core_throughput(settings: Settings, dsn: str, n: int, threads: int, batch: int) -> float:
    """Create -> outbox -> queue -> claim -> complete -> ack for n no-op tasks, in-process, on a
    queue of this row's own (so no earlier row's message is counted)."""
    queue = f"bench_{uuid.uuid4().hex[:8]}"
    svc = Services.build(settings.model_copy(update={"task_queue": queue}), dsn)
    try:
        return _core_throughput(svc, queue, n, threads, batch)
    finally:
        svc.close()


def _core_throughput(svc: Services, queue: str, n: int, threads: int, batch: int) -> float:
    d = svc.dispatcher
    ids: list[uuid.UUID] = []
    t0 = time.perf_counter()
    noop = TaskSpec(job="bench", operator="noop")
    for start in range(0, n, 500):
        ids += [r.task_id for r in d.create_tasks([(noop, "queued")] * min(500, n - start))]
    done = 0
    lock = threading.Lock()
    publisher_done = threading.Event()
    failures: list[BaseException] = []  # a thread's error: the row refuses, it does not hang
    deadline = time.monotonic() + 600

    def publish() -> None:
        try:
            svc.publisher.drain()
        except BaseException as e:
            failures.append(e)
            raise
        publisher_done.set()

    def work() -> None:
        nonlocal done
        try:
            while not failures and time.monotonic() < deadline:
                msgs = svc.driver.receive(queue, batch, 30, wait_seconds=0.2)
                if not msgs:
                    with lock:
                        if publisher_done.is_set() and done >= n:
                            return
                    continue
                for msg in msgs:
                    tid = uuid.UUID(msg.payload["task_id"])
                    try:
                        c = d.claim(ClaimRequest(task_id=tid, worker_id="bench"))
                    except Conflict:
                        continue
                    d.complete(
                        CompleteRequest(
                            task_id=tid,
                            attempt=c.attempt,
                            lease_token=c.lease_token,
                            outcome="succeeded",
                        )
                    )
                    with lock:
                        done += 1
                svc.driver.ack_many(queue, [x.receipt for x in msgs])
        except BaseException as e:
            failures.append(e)
            raise

    pub = threading.Thread(target=publish)
    pub.start()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    pub.join()
    for w in workers:
        w.join()
    took = time.perf_counter() - t0
    if failures:
        raise SystemExit(f"refusing to print: the core row failed: {failures[0]!r}")
    if done != n or len(ids) != n:
        raise SystemExit(f"refusing to print: the core row ran {done} of {len(ids)} tasks, not {n}")
    if not all_succeeded(svc, ids):
        raise SystemExit("refusing to print: the core row's tasks did not all succeed")
    return n / took


def finished_at(svc: Services, ids: list[uuid.UUID] | str, n: int | None = None) -> float | None:
    """When the last of these tasks finished (epoch seconds), once every one of them (and only
    these) succeeded, else None; a failed one refuses. `ids` may be given as a uuid[] literal
    (`n` of them), so a poll does not dump them again."""
    with svc.pool.connection() as conn:
        rows = conn.execute(
            "SELECT status, count(*) AS n, extract(epoch FROM max(finished_at)) AS last "
            "FROM task_status WHERE task_id = ANY(%s::uuid[]) GROUP BY 1",
            [ids],
        ).fetchall()
    by = {r["status"]: r for r in rows}
    if "failed" in by or "canceled" in by:
        raise SystemExit(f"refusing to print: not every task succeeded: {by}")
    done = by.get("succeeded")
    if done is None or done["n"] != (len(ids) if n is None else n):
        return None
    return float(done["last"])


def all_succeeded(svc: Services, ids: list[uuid.UUID] | str, n: int | None = None) -> bool:
    return finished_at(svc, ids, n) is not None


def stack_throughput(stack: LiteStack, n: int) -> tuple[float, float]:
    """n no-op tasks end to end, from just before the first is created until the last one's
    completion (its `finished_at`, the completing transaction's time: the same host clock);
    counts only this row's tasks, by id, and refuses unless every one of them succeeded. With
    the seconds their creation took (no worker sees one before its transaction commits)."""
    svc = stack.services
    t0 = time.time()
    # One transaction, as a run's fan-out makes them (create_tasks: one statement for the
    # tasks, one for their wake-ups).
    noop = TaskSpec(job="bench_e2e", operator="noop")
    ids = [r.task_id for r in svc.dispatcher.create_tasks([(noop, "queued")] * n)]
    made = time.time() - t0
    # The API server runs in this process and the poll shares the database with the path
    # measured: checking n task ids (a probe per id in each of task_status's partitions; 7-32
    # ms for 2,000, and up to a third of a second for 5,000 under load) every few ms took a
    # third of a core from the row, and once a second still took its share. So wait, cheaply,
    # until no wake-up or outbox row is left (a task's wake-up is acked only after its
    # completion committed), then check the ids; the end time comes from the tasks themselves,
    # so the poll's period does not count. Should some other message linger in the queue, the
    # count stops moving: the ids are checked once it has stood still for a second.
    literal = "{" + ",".join(map(str, ids)) + "}"

    def waiting() -> int:
        with svc.pool.connection() as conn:
            left = conn.execute(
                "SELECT (SELECT count(*) FROM queue_messages) + "
                "(SELECT coalesce(sum(cardinality(held)), 0) FROM queue_leases) + "
                "(SELECT count(*) FROM outbox WHERE sent_at IS NULL) AS n"
            ).fetchone()
        assert left is not None
        return int(left["n"])

    deadline = time.monotonic() + 600
    seen, moved = -1, time.monotonic()
    while True:
        left = waiting()
        if left != seen:
            seen, moved = left, time.monotonic()
        if left == 0 or time.monotonic() - moved > 1.0:
            if (last := finished_at(svc, literal, n)) is not None:
                break
            moved = time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError("bench step timed out")
        time.sleep(0.05)
    took = last - t0
    if took <= 0:
        raise SystemExit(f"refusing to print: the last task finished {took:.3f} s after the start")
    return n / took, made


@dataclass(frozen=True)
class Proc:
    ppid: str
    cpu: float  # user + system seconds, all threads
    argv: list[bytes]


def processes() -> dict[str, Proc]:
    """Every process on the machine, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, Proc] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        out[proc.name] = Proc(fields[1], (int(fields[11]) + int(fields[12])) / tick, argv)
    return out


def _ancestor_in(pid: str, procs: dict[str, Proc], roots: set[str]) -> str | None:
    while pid in procs and pid not in roots:
        pid = procs[pid].ppid
    return pid if pid in roots else None


def hosts_running(stack: LiteStack) -> int:
    """Operator hosts running under this stack's workers (the Python program, not the sandbox
    launcher around it)."""
    procs = processes()
    workers = {str(p.pid) for p in stack.workers if p.poll() is None}
    return sum(
        1
        for pid, p in procs.items()
        if b"trace_platform.worker.host_main" in p.argv
        and b"bwrap" not in p.argv[0]
        and _ancestor_in(pid, procs, workers) is not None
    )


ROLES = ("API + bench", "Postgres", "workers", "operator hosts")


def cpu_by_role(stack: LiteStack, postmaster: str) -> dict[str, float]:
    """CPU seconds so far of the processes doing the row's work, by role. The API runs in this
    process, with the bench's own polling."""
    procs = processes()
    workers = {str(p.pid) for p in stack.workers}
    cpu = dict.fromkeys(ROLES, 0.0)
    for pid, p in procs.items():
        top = _ancestor_in(pid, procs, workers | {postmaster})
        if pid == str(os.getpid()):
            cpu["API + bench"] += p.cpu
        elif top == postmaster:
            cpu["Postgres"] += p.cpu
        elif pid in workers:
            cpu["workers"] += p.cpu
        elif top is not None:
            cpu["operator hosts"] += p.cpu
    return cpu


def context_switches() -> int:
    """Machine-wide, since boot."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("ctxt "):
            return int(line.split()[1])
    return 0


def main() -> None:
    os.environ["TRACE_OPERATOR_REGISTRY"] = "testing"  # the no-op test operators
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--tasks", type=int, default=5000)
    ap.add_argument("--e2e-tasks", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--wrappers",
        default="1,4,8,32",
        help="the end-to-end rows' wrappers per worker (each its own operator host)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="end-to-end rows per arrangement")
    ap.add_argument("--warmup", type=int, default=10, help="unmeasured runs before the latencies")
    # Smoke size: no warm-up runs (the latencies are no figure), every row once.
    args = smoke.parse_args(ap, runs=2, warmup=0, tasks=100, e2e_tasks=20, workers=1, wrappers="2")

    root = Path(tempfile.mkdtemp(prefix="trace-dispatch-bench-", dir="/tmp"))
    root.chmod(0o755)
    pg = EmbeddedPostgres(
        root / "pg", durable=smoke.durable()
    )  # fsync on at full size: real commit costs
    pg.start()
    try:
        dsn = pg.dsn()
        migrate(dsn)
        settings = Settings(
            state_dsn=dsn, home=root / "home", auth="permissive", queue_poll_seconds=1.0
        )
        print(f"machine: {os.cpu_count()} cores; Postgres {pg.bindir}; fsync on")
        postmaster = (pg.pgdata / "postmaster.pid").read_text().split()[0]
        with LiteStack(settings, workers=1, dsn=dsn) as stack:
            lat = trigger_to_running(stack, args.runs, args.warmup)
            print(f"trigger request -> running (HTTP, warm worker):      {fmt(lat)}")
            lat2 = commit_to_downstream(stack, args.runs, args.warmup)
            print(f"upstream commit -> downstream running:               {fmt(lat2)}")
        for conc in (int(w) for w in args.wrappers.split(",")):
            with LiteStack(
                settings, workers=args.workers, dsn=dsn, worker_concurrency=conc
            ) as stack:
                # Every wrapper starts its sandboxed host on its first task (~0.35 s of CPU
                # each): a service start, timed on its own row, not per-task cost. A round of
                # warm-up tasks can leave a wrapper without one (its worker's receives took
                # them), so rounds go on until every wrapper's host runs.
                wrappers = args.workers * conc
                warm, rounds = 4 * wrappers, 0
                while rounds < 10 and (rounds == 0 or hosts_running(stack) < wrappers):
                    cold, _ = stack_throughput(stack, warm)
                    rounds += 1
                hosts = hosts_running(stack)
                for _ in range(args.repeat):  # rows on the same warm stack
                    listener = stack.api.app.state.exchange_listener
                    answered0 = listener.server.answered if listener else 0
                    cpu0, ctxt0 = cpu_by_role(stack, postmaster), context_switches()
                    e2e, made = stack_throughput(stack, args.e2e_tasks)
                    cpu1, ctxt1 = cpu_by_role(stack, postmaster), context_switches()
                    answered = (listener.server.answered if listener else 0) - answered0
                    print(
                        f"no-op tasks end to end, {args.workers} workers x {conc} wrapper(s):"
                        f"   {e2e:8.0f} tasks/s  (after {rounds} x {warm} warm-up tasks, the last"
                        f" at {cold:.0f}/s; {hosts}/{wrappers} hosts running before the rows)"
                    )
                    print(
                        f"    of its {args.e2e_tasks / e2e:.2f} s, {made:.2f} s were the creation"
                        " of its tasks (one transaction: no worker sees one before it commits)"
                    )
                    # Where the time goes (the row's span; the poll after its last task included).
                    per_task = {r: (cpu1[r] - cpu0[r]) * 1000 / args.e2e_tasks for r in ROLES}
                    print(
                        "    CPU per task: "
                        + ", ".join(f"{r} {ms:.2f} ms" for r, ms in per_task.items())
                        + f" ({sum(per_task.values()):.2f} in all); machine-wide context switches"
                        f" per task: {(ctxt1 - ctxt0) / args.e2e_tasks:.0f}"
                    )
                    print(
                        f"    claims and completions: {answered} exchanges on the API's exchange"
                        " listener (api/exchange_listener.py) during the row"
                    )
        for threads in (1, 4):
            tput = core_throughput(settings, dsn, args.tasks, threads, 100)
            print(f"Dispatcher core lifecycle, {threads} thread(s), batch 100: {tput:8.0f} tasks/s")
    finally:
        pg.destroy()


if __name__ == "__main__":
    smoke.main(main)
