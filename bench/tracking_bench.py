"""Tracking tables under heartbeat load (issue 42's first two measures).

The tracking tables are split as in the design note (../shared/spec/tracking-cqrs-partitioning.md,
migration 0002): an immutable task_registry range-partitioned by start_day, never updated, and
the one mutable row per task, task_status, hash-partitioned by task_id. The tasks: `--runs` runs
of a one-job DAG, each triggered through the control plane (ControlPlane.trigger: its firing and
root task), with a tree of `--fanout` children under the root and `--fanout` under each child,
created through the Dispatcher (create_tasks: the tasks a root's events would start, each with a
config and an input event of the shape event-driven tasks carry), every one then claimed through
the Dispatcher (claim_many): N running tasks with leases, nothing written by hand.

1. Heartbeat writes per second while tree queries run: `--writers` threads (default 32: an
   API process answers POST /internal/heartbeat on a pool of 40 request threads, so that many
   heartbeats of a fleet can be in flight at once) in `--processes` processes (default 2, as
   two API processes: one Python process's GIL, not Postgres, bounds its heartbeats; each
   process has its own pool and group commit), each thread over its own share of the tasks,
   round and round, call Dispatcher.heartbeat (what that route calls, in-process: no HTTP, so
   the figure is the store's heartbeat path, its group commit (dispatcher/beats.py: the
   heartbeats arriving while one is written go in the next statement), its statement and
   commit, not the API's request handling) with a progress report, for `--seconds`; meanwhile `--readers` threads call ControlPlane.show_run (what GET
   /v1/runs/{id} answers: the run's firing and its task tree joined to each task's status, the
   run_tree statement) over the runs, continuously. Prints heartbeats/s over the row and per
   one-second bucket (min, median), tree queries/s with their p50/p99 latency, and the CPU
   (machine busy, Postgres cores) over the timed window alone: not the writer processes'
   start-up and close. The writer threads are spread over the processes, the remainder one
   each to the first; a process that fails or dies is refused at once, saying why.
   Autovacuum is on, as shipped.
2. Dead-tuple growth: the same rows copied into one unsplit table (every registry and status
   column; primary key task_id; every other index of the two tables restated on it, so each
   query that has an index has it still; the registry's (start_day, task_id) key, there only
   because a partitioned table's key must hold its partition key, and its task_id index, the
   primary key's twin, left out), then `--dead-beats` heartbeats per task on each: the split
   tables through Dispatcher.heartbeat, the unsplit table through the same heartbeat statement
   (db/sql/dispatcher.sql `heartbeat_many`, each heartbeat a batch of one as a lone one is)
   with its table renamed, on a pool of the store's own kind. Both start freshly written
   (VACUUM FULL of the split tables; the copy is new) and vacuumed, with autovacuum OFF on
   every table measured for the whole measurement (page pruning, which no setting stops,
   happens on both). Prints, for each, n_dead_tup, the growth of the heap and of its indexes
   (pg_relation_size, pg_indexes_size), the HOT share (n_tup_hot_upd / n_tup_upd), and the
   ratios unsplit/split. No tree query runs here.

Every row checks its own work before it prints: each heartbeat answered running with a later
lease; afterwards every counted task's row holds the lease the last heartbeat returned and the
progress it reported (its phase and its count of beats: the last beat landed, and it was the
count-th), and the table's n_tup_upd grew by exactly the number of heartbeats counted (every one
landed once, nothing else wrote); every tree read answered the run's whole tree, every task
running. A failed check refuses to print (a non-zero exit).
Run: `.venv/bin/python bench/tracking_bench.py [--seconds 30]`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import re
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

import smoke  # this folder's: run as a script
from embedded_pg import migrated_postgres  # this folder's
from machine import loadavg  # this folder's
from trace_platform.config import Settings
from trace_platform.contract import ClaimRequest, HeartbeatRequest, TaskSpec
from trace_platform.db.queries import load
from trace_platform.identity import lite_admin
from trace_platform.services import Services
from trace_platform.store.tasks.postgres import PostgresStore

DAG = "name: tracking\njobs:\n  root: {operator: noop}\n"
UNSPLIT = "bench_unsplit"
# The shipped heartbeat statement on the unsplit table: the same text, its table renamed.
UNSPLIT_BEAT = re.sub(r"\btask_status\b", UNSPLIT, load("dispatcher")["heartbeat_many"])
LEASE_SECONDS = 3600.0  # no lease runs out during the bench (no reaper runs either)


def refuse(why: str) -> SystemExit:
    return SystemExit(f"refusing to print: {why}")


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


@dataclass(frozen=True)
class Lease:
    task_id: uuid.UUID
    attempt: int
    lease_token: uuid.UUID
    lease_until: datetime


# -- the tasks ---------------------------------------------------------------------------------
def make_runs(svc: Services, runs: int, fanout: int) -> tuple[list[uuid.UUID], list[Lease]]:
    """`runs` triggered runs, each a tree of 1 + fanout + fanout^2 tasks, all claimed."""
    with svc.pool.connection() as conn:
        admin = lite_admin(conn)
    svc.control.deploy(admin, DAG)
    with svc.pool.connection() as conn:
        dag = conn.execute(
            "SELECT dag_id, active_version FROM dags WHERE name = 'tracking'"
        ).fetchone()
    assert dag is not None
    run_ids: list[uuid.UUID] = []
    ids: list[uuid.UUID] = []
    for _ in range(runs):
        fired = svc.control.trigger(admin, "tracking")
        run_id, roots = fired["run_id"], fired["tasks"]
        if len(roots) != 1:
            raise refuse(f"run {run_id} started {len(roots)} root tasks, not 1")
        run_ids.append(run_id)
        ids += roots
        parents = roots
        for job in ("range", "block"):
            specs = [
                (_child(dag, run_id, parent, job, 1000 * (len(ids) + j)), "queued")
                for j, parent in enumerate(p for p in parents for _ in range(fanout))
            ]
            parents = [r.task_id for r in svc.dispatcher.create_tasks(specs)]
            ids += parents
    leases: list[Lease] = []
    for start in range(0, len(ids), 200):
        reqs = [
            ClaimRequest(task_id=t, worker_id=f"bench-{n % 8}")
            for n, t in enumerate(ids[start : start + 200])
        ]
        for req, c in zip(reqs, svc.dispatcher.claim_many(reqs, payload=False), strict=True):
            if isinstance(c, Exception):
                raise refuse(f"claiming task {req.task_id} failed: {c!r}")
            leases.append(Lease(c.task_id, c.attempt, c.lease_token, c.lease_until))
    return run_ids, leases


def _child(dag: dict[str, Any], run_id: uuid.UUID, parent: uuid.UUID, job: str, block: int) -> Any:
    """A task as a root's event would start it: a block range to work on, the event it read."""
    dataset = uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{job}")
    return TaskSpec(
        job=job,
        operator="noop",
        dag_id=dag["dag_id"],
        dag_version=dag["active_version"],
        run_id=run_id,
        parent_task_id=parent,
        config={"chain": "monad", "dataset": f"{job}s", "start_block": block, "batch": 1000},
        input_event={
            "dataset_uuid": str(dataset),
            "producer_task_id": str(parent),
            "range_start": block,
            "range_end": block + 1000,
            "cursor": f"{block + 999}:0x{block:064x}",
        },
    )


# -- the load -----------------------------------------------------------------------------------
Beat = Callable[[Lease, int], datetime]  # one heartbeat (the k-th of the task): its new lease


@dataclass
class Load:
    counts: Counter[uuid.UUID] = field(default_factory=Counter)
    last_until: dict[uuid.UUID, datetime] = field(default_factory=dict)
    buckets: Counter[int] = field(default_factory=Counter)  # completions by whole second
    t0: float = 0.0
    took: float = 0.0
    cpu: float = 0.0  # the writer threads' own CPU seconds (Python and psycopg, this process)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Window:
    """Machine and Postgres CPU over the timed window only: started as the writers are let
    go, stopped as the last one ends, before any process closes its pool (process start-up
    and close are not the heartbeats' load; a backend that exits takes its CPU out of the
    postmaster's children)."""

    def __init__(self, stats: psycopg.Connection[Any]) -> None:
        self.stats = stats
        self.wall = self.busy = self.iowait = self.postgres = 0.0
        self._start = (0.0, 0.0, 0.0, 0.0)

    def _sample(self) -> tuple[float, float, float, float]:
        t, (busy, io) = time.perf_counter(), machine_busy()
        return t, busy, io, postgres_cpu(self.stats)

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> None:
        end = self._sample()
        self.wall, self.busy, self.iowait, self.postgres = (
            b - a for a, b in zip(self._start, end, strict=True)
        )


def drive(
    beat: Beat,
    leases: list[Lease],
    threads: int,
    *,
    seconds: float = 0,
    rounds: int = 0,
    window: Window | None = None,
) -> Load:
    """`threads` writers, each over its own share of the tasks, round and round: for `seconds`,
    or `rounds` beats of every task. A writer's error stops every writer and is raised."""
    out = Load()
    lock = threading.Lock()
    failures: list[BaseException] = []
    gate = threading.Barrier(threads + 1)

    def write(mine: list[Lease]) -> None:
        counts: Counter[uuid.UUID] = Counter()
        last: dict[uuid.UUID, datetime] = {}
        buckets: Counter[int] = Counter()
        cpu0 = time.thread_time()
        try:
            gate.wait()
            t0 = out.t0
            r = 0
            while not failures and (r < rounds if rounds else True):
                for lease in mine:
                    if seconds and time.perf_counter() - t0 >= seconds:
                        return
                    until = beat(lease, counts[lease.task_id] + 1)
                    counts[lease.task_id] += 1
                    last[lease.task_id] = until
                    buckets[int(time.perf_counter() - t0)] += 1
                r += 1
        except BaseException as e:
            failures.append(e)
        finally:
            with lock:
                out.cpu += time.thread_time() - cpu0
                out.counts.update(counts)
                out.last_until.update(last)
                out.buckets.update(buckets)

    workers = [
        threading.Thread(target=write, args=(leases[i::threads],), daemon=True)
        for i in range(threads)
    ]
    for w in workers:
        w.start()
    out.t0 = time.perf_counter()
    gate.wait()
    if window is not None:
        window.start()
    for w in workers:
        w.join()
    out.took = time.perf_counter() - out.t0
    if window is not None:
        window.stop()
    if failures:
        raise failures[0]
    return out


def _beat_process(
    i: int,
    settings: Settings,
    dsn: str,
    leases: list[Lease],
    threads: int,
    seconds: float,
    go: Any,
    stop: Any,
    closing: Any,
    results: Any,
) -> None:
    """One API process's heartbeats: its own Services (pool, Dispatcher, group commit). Says
    ("ready"), then ("done", its Load) and holds its pool open until `closing`; or ("failed",
    why) at once (as text: not every psycopg error pickles)."""
    try:
        svc = Services.build(settings, dsn)
    except BaseException as e:
        results.put((i, "failed", f"could not build its services: {type(e).__name__}: {e}"))
        return
    try:
        results.put((i, "ready", None))
        go.wait()
        if stop.is_set():
            return
        load_ = drive(dispatcher_beat(svc, "tree"), leases, threads, seconds=seconds)
        results.put((i, "done", load_))
        closing.wait()
    except BaseException as e:
        results.put((i, "failed", f"{type(e).__name__}: {e}"))
    finally:
        svc.close()


def drive_processes(
    settings: Settings,
    dsn: str,
    leases: list[Lease],
    processes: int,
    threads: int,
    seconds: float,
    window: Window,
) -> Load:
    """`drive` in `processes` processes at once (as many API processes), `threads` writers
    split among them, each over its own share of the tasks; their loads merged (perf_counter
    is the machine's monotonic clock: one timeline across the processes). A process that
    fails, or dies without a word, is refused at once with its reason."""
    if threads < processes:
        raise refuse(f"{threads} writer threads cannot fill {processes} processes")
    ctx = multiprocessing.get_context("spawn")
    go, stop, closing = ctx.Event(), ctx.Event(), ctx.Event()
    results = ctx.Queue()
    # The remainder goes one each to the first processes: every thread asked for runs.
    share = [threads // processes + int(i < threads % processes) for i in range(processes)]
    procs = [
        ctx.Process(
            target=_beat_process,
            args=(
                i,
                settings,
                dsn,
                leases[i::processes],
                share[i],
                seconds,
                go,
                stop,
                closing,
                results,
            ),
            daemon=True,
        )
        for i in range(processes)
    ]

    def collect(kind: str, within: float) -> list[Any]:
        """Each process's `kind` message, in process order."""
        got: dict[int, Any] = {}
        deadline = time.monotonic() + within
        while len(got) < processes:
            try:
                i, said, what = results.get(timeout=0.2)
            except queue.Empty:
                gone = [i for i, p in enumerate(procs) if i not in got and p.exitcode is not None]
                if gone:  # its last words may still be in the pipe
                    try:
                        i, said, what = results.get(timeout=1)
                    except queue.Empty:
                        code = procs[gone[0]].exitcode
                        raise refuse(
                            f"writer process {gone[0]} exited ({code}) before it was {kind}"
                        ) from None
                elif time.monotonic() > deadline:
                    raise refuse(f"writer processes not {kind} after {within:.0f} s") from None
                else:
                    continue
            if said == "failed":
                raise refuse(f"writer process {i} failed: {what}")
            got[i] = what
        return [got[i] for i in range(processes)]

    for p in procs:
        p.start()
    ok = False
    try:
        collect("ready", 120)
        go.set()
        window.start()
        got: list[Load] = collect("done", seconds + 120)
        window.stop()  # every writer done, every pool still open
        ok = True
    finally:
        stop.set()  # a process still at the start line leaves without beating
        go.set()
        closing.set()
        for p in procs:
            # After a failure the others are not waited for (one may be stuck connecting).
            p.join(timeout=30 if ok else 1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
    out = Load(t0=min(g.t0 for g in got))
    for g in got:
        out.counts.update(g.counts)
        out.last_until.update(g.last_until)
        out.buckets.update(g.buckets)  # each by its own start: they start within a moment
        out.cpu += g.cpu
    out.took = max(g.t0 + g.took for g in got) - out.t0
    return out


def dispatcher_beat(svc: Services, phase: str) -> Beat:
    def beat(lease: Lease, k: int) -> datetime:
        r = svc.dispatcher.heartbeat(
            HeartbeatRequest(
                task_id=lease.task_id,
                attempt=lease.attempt,
                lease_token=lease.lease_token,
                progress={"phase": phase, "beat": k},
            )
        )
        if r.status != "running" or r.cancel_requested or r.lease_until <= lease.lease_until:
            raise refuse(f"heartbeat of task {lease.task_id} answered {r!r}")
        return r.lease_until

    return beat


def unsplit_beat(store: PostgresStore, phase: str) -> Beat:
    def beat(lease: Lease, k: int) -> datetime:
        with store.transaction() as tx:
            row = tx.conn.execute(
                UNSPLIT_BEAT,
                {  # a batch of one, as the store sends a lone heartbeat
                    "task_ids": [lease.task_id],
                    "attempts": [lease.attempt],
                    "lease_tokens": [lease.lease_token],
                    "progress": [Jsonb({"phase": phase, "beat": k})],
                    "lease": LEASE_SECONDS,
                },
            ).fetchone()
        if row is None or row["status"] != "running" or row["lease_until"] <= lease.lease_until:
            raise refuse(f"the unsplit heartbeat of task {lease.task_id} answered {row!r}")
        return row["lease_until"]

    return beat


@dataclass
class Reads:
    done: list[tuple[float, float]] = field(default_factory=list)  # (when it ended, seconds)
    failures: list[BaseException] = field(default_factory=list)
    cpu: float = 0.0  # the thread's own CPU seconds


def read_trees(
    svc: Services, run_ids: list[uuid.UUID], per_run: int, stop: threading.Event, offset: int
) -> Reads:
    """Tree reads until `stop`; a wrong tree is a failure (and stops the others)."""
    cpu0 = time.thread_time()
    out = Reads()
    with svc.pool.connection() as conn:
        admin = lite_admin(conn)
    i = offset
    try:
        while not stop.is_set():
            run_id = run_ids[i % len(run_ids)]
            i += 1
            t = time.perf_counter()
            tasks = svc.control.show_run(admin, run_id)["tasks"]
            e = time.perf_counter()
            states = Counter(x["status"] for x in tasks)
            if len(tasks) != per_run or states["running"] != per_run:
                raise refuse(f"run {run_id}'s tree had {len(tasks)} tasks, {dict(states)}")
            out.done.append((e, e - t))
    except BaseException as e:
        out.failures.append(e)
        stop.set()
    out.cpu = time.thread_time() - cpu0
    return out


# -- what Postgres says ------------------------------------------------------------------------
SPLIT = ("task_status", "task_registry")


def leaves(conn: psycopg.Connection[Any], parents: tuple[str, ...]) -> list[str]:
    rows = conn.execute(
        "SELECT relid::text AS rel FROM pg_partition_tree(%s::regclass) WHERE isleaf",
        (parents[0],),
    ).fetchall()
    rest = leaves(conn, parents[1:]) if parents[1:] else []
    return [r["rel"] for r in rows] + rest


def table_stats(conn: psycopg.Connection[Any], rels: list[str]) -> dict[str, int]:
    """Summed over `rels`: updates, HOT updates, dead tuples, heap and index bytes."""
    row = conn.execute(
        """SELECT sum(n_tup_upd) AS upd, sum(n_tup_hot_upd) AS hot, sum(n_dead_tup) AS dead,
                  sum(pg_relation_size(relid)) AS heap, sum(pg_indexes_size(relid)) AS idx
           FROM pg_stat_user_tables WHERE relid = ANY(%s::regclass[])""",
        (rels,),
    ).fetchone()
    assert row is not None
    return {k: int(v or 0) for k, v in row.items()}


def quiesce(conn: psycopg.Connection[Any]) -> None:
    """Wait until no other client of this database is connected: a backend flushes its table
    statistics as it exits (before it leaves pg_stat_activity), so every update it made is
    counted in pg_stat_user_tables from then on."""
    deadline = time.monotonic() + 60
    while True:
        row = conn.execute(
            """SELECT count(*) AS n FROM pg_stat_activity
               WHERE datname = current_database() AND pid <> pg_backend_pid()
                 AND backend_type = 'client backend'"""
        ).fetchone()
        if row is not None and row["n"] == 0:
            return
        if time.monotonic() > deadline:
            raise refuse(f"{row} other clients still connected after 60 s")
        time.sleep(0.05)


def postgres_cpu(conn: psycopg.Connection[Any]) -> float:
    """CPU seconds so far of the postmaster's children (every backend and worker), from /proc."""
    row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
    assert row is not None
    postmaster = _stat(str(row["pid"]))[1]
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and (f := _stat(proc.name)) and f[1] == postmaster:
            total += (int(f[11]) + int(f[12])) / tick
    return total


def _stat(pid: str) -> list[str]:
    """/proc/<pid>/stat's fields after the command (state, ppid, ...); [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def machine_busy() -> tuple[float, float]:
    """(busy, iowait) jiffies of every core since boot, from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return float(f[0] + f[1] + f[2] + f[5] + f[6] + f[7]), float(f[4])


def check_landed(
    conn: psycopg.Connection[Any],
    table: str,
    load_: Load,
    phase: str,
    before: dict[str, int],
    after: dict[str, int],
) -> None:
    """Every counted heartbeat landed, once: each task's row holds the last lease it was given
    and its last progress (this phase's, its count-th beat), and the table's updates grew by
    the count."""
    ids = list(load_.counts)
    rows = conn.execute(
        f"SELECT task_id, lease_until, progress FROM {table} WHERE task_id = ANY(%s)", (ids,)
    ).fetchall()
    if len(rows) != len(ids):
        raise refuse(f"{table} holds {len(rows)} of the {len(ids)} tasks beaten")
    for r in rows:
        n = load_.counts[r["task_id"]]
        if r["progress"] != {"phase": phase, "beat": n}:
            raise refuse(f"task {r['task_id']}: {n} beats counted, its row says {r['progress']}")
        if r["lease_until"] != load_.last_until[r["task_id"]]:
            raise refuse(f"task {r['task_id']}'s lease is not the one its last beat returned")
    if after["upd"] - before["upd"] != load_.total:
        raise refuse(
            f"{table}: {after['upd'] - before['upd']} updates, {load_.total} heartbeats counted"
        )


def row_widths(conn: psycopg.Connection[Any]) -> dict[str, float]:
    row = conn.execute(
        f"""SELECT (SELECT avg(pg_column_size(r.*)) FROM task_registry r) AS registry,
                   (SELECT avg(pg_column_size(s.*)) FROM task_status s) AS status,
                   (SELECT avg(pg_column_size(u.*)) FROM {UNSPLIT} u) AS unsplit"""
    ).fetchone()
    assert row is not None
    return {k: float(v) for k, v in row.items()}


# -- 1. heartbeats while tree queries run -----------------------------------------------------
def heartbeats_under_reads(
    settings: Settings,
    dsn: str,
    stats: psycopg.Connection[Any],
    run_ids: list[uuid.UUID],
    leases: list[Lease],
    per_run: int,
    args: argparse.Namespace,
) -> None:
    stats.execute("VACUUM ANALYZE task_status, task_registry")
    rels = leaves(stats, ("task_status",))
    quiesce(stats)
    before = table_stats(stats, rels)
    svc = Services.build(settings, dsn)
    stop = threading.Event()
    reads: list[tuple[list[tuple[float, float]], list[BaseException]]] = []
    readers = [
        threading.Thread(
            target=lambda i=i: reads.append(read_trees(svc, run_ids, per_run, stop, i * 7)),
            daemon=True,
        )
        for i in range(args.readers)
    ]
    try:
        for r in readers:
            r.start()
        window = Window(stats)
        if args.processes > 1:
            load_ = drive_processes(
                settings, dsn, leases, args.processes, args.writers, args.seconds, window
            )
        else:
            load_ = drive(
                dispatcher_beat(svc, "tree"),
                leases,
                args.writers,
                seconds=args.seconds,
                window=window,
            )
    finally:
        stop.set()
        for r in readers:
            r.join()
        svc.close()
    for rd in reads:
        if rd.failures:
            raise rd.failures[0]
    quiesce(stats)
    check_landed(stats, "task_status", load_, "tree", before, table_stats(stats, rels))
    t0, t1 = load_.t0, load_.t0 + load_.took
    lat = [s * 1000 for rd in reads for end, s in rd.done if t0 <= end <= t1]
    if not lat:
        raise refuse("no tree query completed during the heartbeats")
    full = [load_.buckets[s] for s in range(int(args.seconds))]  # the whole seconds
    print(
        f"1. heartbeats, {args.writers} writer threads in {args.processes} process(es) (each as "
        "an API process: its own pool and group commit; Dispatcher.heartbeat in-process, no HTTP)"
        f" over {len(leases)} running tasks, {args.readers} tree-reader threads "
        f"(ControlPlane.show_run, {len(run_ids)} runs of {per_run} tasks), {load_.took:.1f} s:"
    )
    print(
        f"   heartbeats/s: {load_.total / load_.took:8.0f} over the row; per second: min "
        f"{min(full)}, median {statistics.median(full):.0f}  ({load_.total} heartbeats, "
        f"every one landed; target >= 5,000/s, floor 50,000/min = 833/s)"
    )
    print(
        f"   tree queries/s: {len(lat) / load_.took:6.1f}   latency p50 {pct(lat, 50):.2f} ms, "
        f"p99 {pct(lat, 99):.2f} ms  (n={len(lat)}, every tree whole and running)"
    )
    # Where the time went: whether the machine was saturated, and by whom.
    # Over the timed window alone (Window): not the writer processes' start-up and close.
    tick = os.sysconf("SC_CLK_TCK") * (os.cpu_count() or 1) * window.wall
    reads_n = sum(len(rd.done) for rd in reads)
    print(
        f"   CPU: machine {window.busy / tick:.0%} busy (iowait {window.iowait / tick:.0%}) of "
        f"{os.cpu_count()} cores; Postgres {window.postgres / window.wall:.2f} cores; writer "
        "threads "
        f"{load_.cpu * 1e6 / load_.total:.0f} us per heartbeat, reader threads "
        f"{sum(rd.cpu for rd in reads) * 1e3 / max(reads_n, 1):.2f} ms per tree (their own CPU)"
    )


# -- 2. dead tuples: split against unsplit -----------------------------------------------------
def make_unsplit(conn: psycopg.Connection[Any]) -> list[str]:
    """The unsplit table of the same rows and the indexes the split ones have (a status column
    that copies a registry one, worker_pool, once); the names of the indexes restated."""
    status_cols = [
        r["column_name"]
        for r in conn.execute(
            """SELECT column_name FROM information_schema.columns
               WHERE table_name = 'task_status' AND column_name NOT IN (
                 SELECT column_name FROM information_schema.columns
                 WHERE table_name = 'task_registry')
               ORDER BY ordinal_position"""
        ).fetchall()
    ]
    cols = ", ".join(f"s.{c}" for c in status_cols)
    conn.execute(
        f"CREATE TABLE {UNSPLIT} AS SELECT r.*, {cols} FROM task_registry r "
        "JOIN task_status s ON s.task_id = r.task_id AND s.start_day = r.start_day"
    )
    conn.execute(f"ALTER TABLE {UNSPLIT} ADD PRIMARY KEY (task_id)")
    made: list[str] = []
    for parent in SPLIT:
        for r in conn.execute(
            """SELECT c.relname, pg_get_indexdef(i.indexrelid) AS def FROM pg_index i
               JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = %s::regclass AND NOT i.indisprimary ORDER BY c.relname""",
            (parent,),
        ).fetchall():
            if r["def"].endswith("USING btree (task_id)"):
                continue  # the primary key's twin
            ddl, n = re.subn(
                rf"^CREATE (UNIQUE )?INDEX {r['relname']} ON (ONLY )?public\.{parent} ",
                rf"CREATE \1INDEX {UNSPLIT}_{r['relname']} ON {UNSPLIT} ",
                r["def"],
            )
            if n != 1:
                raise refuse(f"could not restate index {r['relname']}: {r['def']}")
            conn.execute(ddl)
            made.append(r["relname"])
    return made


def dead_tuples(
    settings: Settings, dsn: str, stats: psycopg.Connection[Any], leases: list[Lease], args: Any
) -> None:
    # Both sides freshly written: the split tables rewritten, the unsplit one new; then each
    # vacuumed (n_dead_tup from zero) and autovacuum off for the measurement on every leaf.
    stats.execute("VACUUM FULL task_status, task_registry")
    indexes = make_unsplit(stats)
    split = leaves(stats, SPLIT)
    registry = leaves(stats, ("task_registry",))
    for rel in [*split, UNSPLIT]:
        stats.execute(f"ALTER TABLE {rel} SET (autovacuum_enabled = false)")
    stats.execute(f"VACUUM ANALYZE task_status, task_registry, {UNSPLIT}")
    widths = row_widths(stats)
    quiesce(stats)
    s0, u0, r0 = (table_stats(stats, x) for x in (split, [UNSPLIT], registry))

    svc = Services.build(settings, dsn)
    try:
        window = Window(stats)
        a = drive(
            dispatcher_beat(svc, "split"),
            leases,
            args.writers,
            rounds=args.dead_beats,
            window=window,
        )
        pg_per_beat = window.postgres / a.total
    finally:
        svc.close()
    quiesce(stats)
    s1 = table_stats(stats, split)
    check_landed(stats, "task_status", a, "split", s0, s1)
    if (r1 := table_stats(stats, registry)) != r0:
        raise refuse(f"the immutable registry changed: {r0} -> {r1}")

    store = PostgresStore.connect(dsn, max_size=args.writers)
    try:
        b = drive(unsplit_beat(store, "unsplit"), leases, args.writers, rounds=args.dead_beats)
    finally:
        store.pool.close()
    quiesce(stats)
    u1 = table_stats(stats, [UNSPLIT])
    check_landed(stats, UNSPLIT, b, "unsplit", u0, u1)
    if a.total != b.total or a.total != len(leases) * args.dead_beats:
        raise refuse(f"{a.total} split and {b.total} unsplit heartbeats, not equal")

    def grow(x0: dict[str, int], x1: dict[str, int]) -> dict[str, float]:
        d = {k: x1[k] - x0[k] for k in ("upd", "hot", "dead", "heap", "idx")}
        return {**d, "total": d["heap"] + d["idx"], "hot_share": d["hot"] / max(d["upd"], 1)}

    gs, gu = grow(s0, s1), grow(u0, u1)
    print(
        f"2. dead tuples: {a.total} heartbeats ({args.dead_beats} per task, {args.writers} "
        f"writer threads) on each of the split tables and one unsplit table of the same "
        f"{len(leases)} rows; autovacuum off on both for the measurement"
    )
    print(
        f"   rows: registry {widths['registry']:.0f} B + status {widths['status']:.0f} B; "
        f"unsplit {widths['unsplit']:.0f} B. Unsplit indexes: primary key (task_id) + "
        f"{', '.join(indexes)}"
    )
    kib = 1024
    for name, g, took in (("split (as shipped)", gs, a.took), ("unsplit", gu, b.took)):
        print(
            f"   {name:19s} n_dead_tup +{g['dead']:<8.0f} heap +{g['heap'] / kib:8.0f} KiB  "
            f"indexes +{g['idx'] / kib:8.0f} KiB  HOT {g['hot_share']:6.1%} of {g['upd']:.0f}"
            f" updates  ({g['upd'] / took:.0f}/s)"
        )
    print(
        "   (the unsplit side's rate is of the bare statement, without the Dispatcher's Python:"
        " not a speed comparison)"
    )

    def ratio(k: str) -> str:
        if gs[k]:
            return f"{gu[k] / gs[k]:.2f}x"
        return f"{gu[k] / kib:.0f} KiB vs 0" if k in ("heap", "idx", "total") else f"{gu[k]} vs 0"

    print(
        f"   split, no readers: Postgres {pg_per_beat * 1e6:.0f} us and the writer threads "
        f"{a.cpu * 1e6 / a.total:.0f} us of CPU per heartbeat"
    )
    print(
        f"   unsplit/split: dead tuples {ratio('dead')}, heap growth {ratio('heap')}, index "
        f"growth {ratio('idx')}, heap+index growth {ratio('total')} (registry: 0 updates)"
    )


def main() -> None:
    os.environ["TRACE_OPERATOR_REGISTRY"] = "testing"  # the no-op test operator
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--fanout", type=int, default=9, help="children per task, two levels deep")
    ap.add_argument("--writers", type=int, default=32)
    ap.add_argument(
        "--processes", type=int, default=2, help="writer processes (API processes), row 1"
    )
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--dead-beats", type=int, default=50, help="heartbeats per task, row 2")
    args = smoke.parse_args(
        ap, runs=2, fanout=2, writers=2, processes=2, readers=1, seconds=1.5, dead_beats=2
    )
    per_run = 1 + args.fanout + args.fanout**2
    print(f"load average before: {loadavg()}")
    with migrated_postgres("trace-tracking-bench-") as (root, dsn):
        settings = Settings(
            state_dsn=dsn,
            home=root / "home",
            auth="permissive",
            lease_seconds=LEASE_SECONDS,
            pool_max_size=max(args.writers, args.readers) + 2,
        )
        svc = Services.build(settings, dsn)
        try:
            run_ids, leases = make_runs(svc, args.runs, args.fanout)
        finally:
            svc.close()
        if len(leases) != args.runs * per_run:
            raise refuse(f"{len(leases)} tasks running, not {args.runs * per_run}")
        with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as stats:
            heartbeats_under_reads(settings, dsn, stats, run_ids, leases, per_run, args)
            dead_tuples(settings, dsn, stats, leases, args)
    print(f"load average after: {loadavg()}")


if __name__ == "__main__":
    smoke.main(main)
