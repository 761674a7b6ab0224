#!/usr/bin/env python
"""pgqueue against PgQueuer 1.6 and procrastinate 3.10, side by side, on one durable Postgres.

Starts a throwaway embedded cluster (fsync on) under /tmp, one database per system, and measures
for each: enqueue throughput (one message per transaction, and 100 per transaction),
dequeue+complete throughput (1 and 4 consumers, batch 10 and 100 where the system has a batch
setting), and enqueue->receive latency with an idle consumer woken by LISTEN/NOTIFY. A bare
SKIP LOCKED loop on pgqueue's own `queue_messages` table is the ceiling reference; the durable
pgqueue and the bare loop also drain in interleaved pairs (`--pairs`), whose ratios, unlike
the columns' (measured minutes apart), do not carry the machine's drift.

An `sqs` column (issue 41) runs the sqs QueueDriver (SqsQueue, as the aws profile builds it)
against moto's server on 127.0.0.1 (bench/moto_server.py: its own process, in memory), on the
metrics that apply: enqueue one message a call and 100 a publish_many (10 SendMessageBatch
calls: SQS's batch is 10), drains at batch 10 (SQS's most per ReceiveMessage; each batch
deleted by the next receive's call, as pgqueue folds its acks), and enqueue->receive with a
consumer long polling. moto is a local emulator (Python, in memory), not AWS: its figures say
what the driver and boto3 cost against that emulator and are not comparable with AWS's
latency or throughput (nor with the Postgres columns). Each sqs run has a fresh queue; a drain
refuses unless it received exactly its own N distinct messages and left the queue empty.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

import psycopg
from psycopg.types.json import Jsonb

import smoke  # this folder's: run as a script
from machine import describe, loadavg  # this folder's: run as a script
from moto_server import moto_server  # this folder's: run as a script
from trace_platform.db.embedded import EmbeddedPostgres
from trace_platform.db.migrate import migrate
from trace_platform.queue.pgqueue import PgQueue

OURS = "pgqueue"  # as production runs it: receive, ack and nack with synchronous_commit=off
OURS_DURABLE = "pgqueue durable"  # every call with synchronous_commit=on, as the peers run


def installed(dist: str) -> str | None:
    """A peer's version, or None when the bench extra is not installed (its side is skipped)."""
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


PGQUEUER = f"PgQueuer {installed('pgqueuer')}"
PROCRASTINATE = f"procrastinate {installed('procrastinate')}"
BARE = "bare SKIP LOCKED"
SQS = "sqs on moto (emulator)"
SYSTEMS = [OURS, OURS_DURABLE, PGQUEUER, PROCRASTINATE, BARE, SQS]
# What each system commits with (printed beside its figures: a ratio is only as fair as this).
DURABILITY = {
    OURS: "publish durable; receive/ack/nack synchronous_commit=off (production)",
    OURS_DURABLE: "every call synchronous_commit=on",
    PGQUEUER: "synchronous_commit=on (server default)",
    PROCRASTINATE: "synchronous_commit=on (server default)",
    BARE: "synchronous_commit=on (server default)",
    SQS: f"moto {installed('moto')} (a local emulator, not AWS: not comparable with "
    "AWS's latency or throughput, nor with the Postgres columns), in memory, in its own "
    "process on 127.0.0.1; boto3 "
    f"{installed('boto3')}",
}
# No ratio column against the emulator: the sqs column is not a peer's figure.
PEERS = [PGQUEUER, PROCRASTINATE, BARE]

QUEUE = "bench"
ENQ_BATCH = 100
CONSUMERS = 4
LATENCY_WARMUP = 10  # first samples dropped: connection setup, first LISTEN, plan caching
PROBE_TIMEOUT_S = 6.0  # a latency probe nobody received in this long is counted as missing


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str  # "msg/s" (higher is better) or "ms" (lower is better)


METRICS = [
    Metric("enq1", "enqueue, 1 msg/txn", "msg/s"),
    Metric("enq100", f"enqueue, {ENQ_BATCH} msgs/txn", "msg/s"),
    Metric("deq1_b10_ack1", "dequeue+complete, 1 consumer, batch 10, per-message ack", "msg/s"),
    Metric("deq1_b10_many", "dequeue+complete, 1 consumer, batch 10, separate ack", "msg/s"),
    Metric("deq1_b10", "dequeue+complete, 1 consumer, batch 10", "msg/s"),
    Metric("deq1_b100", "dequeue+complete, 1 consumer, batch 100", "msg/s"),
    Metric("deq4_b10", f"dequeue+complete, {CONSUMERS} consumers, batch 10", "msg/s"),
    Metric("deq4_b100", f"dequeue+complete, {CONSUMERS} consumers, batch 100", "msg/s"),
    Metric("lat50", "enqueue->receive p50 (idle consumer)", "ms"),
    Metric("lat99", "enqueue->receive p99 (idle consumer)", "ms"),
]


@dataclass
class Config:
    n: int
    single_n: int
    proc_n: int
    repeats: int
    latency_samples: int
    latency_gap_s: float
    pairs: int = 5
    sqs_n: int = 1_000
    sqs_single_n: int = 500
    sqs: bool = True


@dataclass
class Results:
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: dict[tuple[str, str], str] = field(default_factory=dict)
    # Durable pgqueue / bare loop, per interleaved pair of drains (see `paired_with_bare`).
    pairs: dict[str, list[float]] = field(default_factory=dict)

    def put(self, metric: str, system: str, value: float, note: str = "") -> None:
        self.values.setdefault(metric, {})[system] = value
        if note:
            self.notes[(metric, system)] = note


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median_of(repeats: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(repeats))


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


def plain_dsn(dsn: str) -> str:
    """asyncpg passes unknown URL parameters (connect_timeout) on as server settings."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(query=""))


def wakeups(n: int) -> list[dict[str, str]]:
    return [{"kind": "task_wakeup", "task_id": str(uuid4())} for _ in range(n)]


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def send_probes(
    publish: Callable[[dict[str, str]], Any],
    total: int,
    gap: float,
    sent: dict[str, float],
    got: threading.Event,
) -> None:
    """Closed-loop latency probes: each sent (its time noted in `sent`) once the consumer set
    `got` for the previous one (or PROBE_TIMEOUT_S passed), `gap` seconds after."""
    for m in wakeups(total):
        got.clear()
        sent[m["task_id"]] = time.perf_counter()
        publish(m)
        got.wait(PROBE_TIMEOUT_S)
        time.sleep(gap)


def sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)  # type: ignore[arg-type]


def scalar(dsn: str, statement: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(statement).fetchone()  # type: ignore[arg-type]
        return row[0] if row else None


def run_consumers(consumers: int, consume: Callable[[int], None]) -> float:
    """Seconds from the consumers' common start (a barrier: no thread's start-up is timed)
    until the last has returned; `consume(i)` is consumer i's loop."""
    start = threading.Barrier(consumers + 1)

    def body(i: int) -> None:
        start.wait()
        consume(i)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(consumers)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


# -- pgqueue (ours) ---------------------------------------------------------------------------
class Ours:
    def __init__(self, dsn: str, relaxed_acks: bool = True) -> None:
        self.dsn = dsn
        # The driver as production builds it: autocommit pools, relaxed acks (or all durable).
        self.q = PgQueue.from_dsn(
            dsn,
            max_attempts=20,
            poll_seconds=1.0,
            max_size=CONSUMERS + 4,
            relaxed_acks=relaxed_acks,
        )

    def close(self) -> None:
        self.q.close()

    def reset(self) -> None:
        sql(self.dsn, "TRUNCATE queue_messages, queue_leases, queue_dead")

    def preload(self, n: int) -> None:
        self.reset()
        for part in chunks(wakeups(n), 1000):
            self.q.publish_many(QUEUE, part)
        sql(self.dsn, "VACUUM ANALYZE queue_messages")

    def enqueue_single(self, n: int) -> float:
        self.reset()
        msgs = wakeups(n)
        t0 = time.perf_counter()
        for m in msgs:
            self.q.publish(QUEUE, m)
        return n / (time.perf_counter() - t0)

    def enqueue_batched(self, n: int) -> float:
        self.reset()
        parts = list(chunks(wakeups(n), ENQ_BATCH))
        t0 = time.perf_counter()
        for part in parts:
            self.q.publish_many(QUEUE, part)
        return n / (time.perf_counter() - t0)

    def drain(self, n: int, batch: int, consumers: int, ack: str = "folded") -> float:
        """`ack`: "folded" (each batch acked in the next receive's statement, one commit per
        batch; the last, empty receive acks the last batch), "many" (ack_many per batch) or
        "each" (one ack per message)."""
        self.preload(n)
        done = [0] * consumers

        def consume(i: int) -> None:
            held: list[str] = []
            while msgs := self.q.receive(QUEUE, batch, 60, ack=held):
                held = []
                if ack == "each":
                    for m in msgs:
                        self.q.ack(QUEUE, m.receipt)
                elif ack == "many":
                    self.q.ack_many(QUEUE, [m.receipt for m in msgs])
                else:
                    held = [m.receipt for m in msgs]
                done[i] += len(msgs)

        elapsed = run_consumers(consumers, consume)
        # Every message acked: none left to deliver, and no batch lease still holding one.
        left = scalar(
            self.dsn,
            "SELECT (SELECT count(*) FROM queue_messages)"
            " + (SELECT coalesce(sum(cardinality(held)), 0) FROM queue_leases)",
        )
        if sum(done) != n or left:
            raise RuntimeError(f"pgqueue drained {sum(done)}/{n}, {left} left")
        return n / elapsed

    def latency(self, samples: int, gap: float) -> list[float]:
        self.reset()
        sent: dict[str, float] = {}
        lat: list[float] = []
        stop_id = str(uuid4())
        got = threading.Event()

        def consume() -> None:
            while True:
                msgs = self.q.receive(QUEUE, 1, 30, wait_seconds=5)
                now = time.perf_counter()
                for m in msgs:
                    tid = m.payload["task_id"]
                    if tid == stop_id:
                        return
                    lat.append(now - sent[tid])
                    got.set()
                    self.q.ack(QUEUE, m.receipt)

        consumer = threading.Thread(target=consume)
        consumer.start()
        time.sleep(0.3)  # let it go idle on LISTEN
        send_probes(lambda m: self.q.publish(QUEUE, m), samples + LATENCY_WARMUP, gap, sent, got)
        self.q.publish(QUEUE, {"kind": "task_wakeup", "task_id": stop_id})
        consumer.join(30)
        return lat[LATENCY_WARMUP:]


# -- bare SKIP LOCKED on queue_messages (ceiling reference) ----------------------------------
class Bare:
    INSERT_ONE = "INSERT INTO queue_messages (queue_name, payload) VALUES (%s, %s)"
    # Binary-format text[] cast server-side: psycopg's text-format array dumper escapes every
    # '"' of every JSON element with a regex (~20 us per element), which is not a Postgres cost.
    INSERT_MANY = (
        "INSERT INTO queue_messages (queue_name, payload) "
        "SELECT %s, p::jsonb FROM unnest(%b::text[]) AS p"
    )
    INSERT_NOTIFY = (
        "WITH ins AS (INSERT INTO queue_messages (queue_name, payload) VALUES (%s, %s)) "
        "SELECT pg_notify('bare_queue', '')"
    )
    LOCK = (
        "SELECT id, payload FROM queue_messages WHERE queue_name = %s "
        "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
    )
    DELETE = "DELETE FROM queue_messages WHERE id = ANY(%s)"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def reset(self) -> None:
        sql(self.dsn, "TRUNCATE queue_messages, queue_leases, queue_dead")

    def enqueue_single(self, n: int) -> float:
        self.reset()
        msgs = [Jsonb(m) for m in wakeups(n)]
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            t0 = time.perf_counter()
            for m in msgs:
                conn.execute(self.INSERT_ONE, (QUEUE, m))
            return n / (time.perf_counter() - t0)

    def enqueue_batched(self, n: int) -> float:
        self.reset()
        msgs = wakeups(n)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            t0 = time.perf_counter()
            for part in chunks(msgs, ENQ_BATCH):
                conn.execute(self.INSERT_MANY, (QUEUE, [json.dumps(m) for m in part]))
            return n / (time.perf_counter() - t0)

    def preload(self, n: int) -> None:
        self.reset()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for part in chunks(wakeups(n), 1000):
                conn.execute(self.INSERT_MANY, (QUEUE, [json.dumps(m) for m in part]))
        sql(self.dsn, "VACUUM ANALYZE queue_messages")

    def _take(self, conn: psycopg.Connection[Any], batch: int) -> int:
        with conn.transaction():
            rows = conn.execute(self.LOCK, (QUEUE, batch)).fetchall()
            if rows:
                conn.execute(self.DELETE, ([r[0] for r in rows],))
        return len(rows)

    def drain(self, n: int, batch: int, consumers: int) -> float:
        self.preload(n)
        done = [0] * consumers
        conns = [psycopg.connect(self.dsn, autocommit=True) for _ in range(consumers)]

        def consume(i: int) -> None:
            while got := self._take(conns[i], batch):
                done[i] += got

        elapsed = run_consumers(consumers, consume)
        for c in conns:
            c.close()
        if sum(done) != n:
            raise RuntimeError(f"bare drained {sum(done)}/{n}")
        return n / elapsed

    def latency(self, samples: int, gap: float) -> list[float]:
        self.reset()
        sent: dict[str, float] = {}
        lat: list[float] = []
        total = samples + LATENCY_WARMUP
        listen = psycopg.connect(self.dsn, autocommit=True)
        listen.execute("LISTEN bare_queue")
        work = psycopg.connect(self.dsn, autocommit=True)
        stop = threading.Event()
        got = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                for _ in listen.notifies(timeout=0.5, stop_after=1):
                    while True:
                        with work.transaction():
                            rows = work.execute(self.LOCK, (QUEUE, 1)).fetchall()
                            if not rows:
                                break
                            now = time.perf_counter()
                            work.execute(self.DELETE, ([r[0] for r in rows],))
                        lat.extend(now - sent[r[1]["task_id"]] for r in rows)
                        got.set()

        consumer = threading.Thread(target=consume)
        consumer.start()
        time.sleep(0.3)
        with psycopg.connect(self.dsn, autocommit=True) as prod:
            send_probes(
                lambda m: prod.execute(self.INSERT_NOTIFY, (QUEUE, Jsonb(m))), total, gap, sent, got
            )
        stop.set()
        consumer.join(5)
        listen.close()
        work.close()
        return lat[LATENCY_WARMUP:]


# -- PgQueuer ---------------------------------------------------------------------------------
class PgQueuerBench:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.adsn = plain_dsn(dsn)
        self.tables: list[str] = []

    async def _queries(self) -> tuple[Any, Any]:
        import asyncpg
        from pgqueuer import Queries

        conn = await asyncpg.connect(self.adsn)
        return conn, Queries.from_asyncpg_connection(conn)

    async def install(self) -> None:
        conn, queries = await self._queries()
        try:
            await queries.install()
            self.tables = [
                queries.qbe.settings.queue_table,
                queries.qbe.settings.queue_table_log,
                queries.qbe.settings.statistics_table,
            ]
        finally:
            await conn.close()

    def reset(self) -> None:
        sql(self.dsn, f"TRUNCATE {', '.join(self.tables)}")

    async def _enqueue(self, n: int, batch: int) -> float:
        self.reset()
        payloads = [str(i).encode() for i in range(n)]
        conn, queries = await self._queries()
        try:
            t0 = time.perf_counter()
            if batch == 1:
                for p in payloads:
                    await queries.enqueue("noop", p)
            else:
                for part in chunks(payloads, batch):
                    await queries.enqueue(["noop"] * len(part), part, [0] * len(part))
            return n / (time.perf_counter() - t0)
        finally:
            await conn.close()

    def enqueue_single(self, n: int) -> float:
        return asyncio.run(self._enqueue(n, 1))

    def enqueue_batched(self, n: int) -> float:
        return asyncio.run(self._enqueue(n, ENQ_BATCH))

    def preload(self, n: int) -> None:
        asyncio.run(self._enqueue(n, 1000))
        sql(self.dsn, f"VACUUM ANALYZE {self.tables[0]}")

    def _manager(self, queries: Any, on_job: Callable[[Any], None] | None = None) -> Any:
        from pgqueuer import QueueManager

        qm = QueueManager(queries)

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            if on_job is not None:
                on_job(job)

        return qm

    async def _drain(self, n: int, batch: int, consumers: int) -> float:
        from pgqueuer.domain.types import QueueExecutionMode

        pairs = [await self._queries() for _ in range(consumers)]
        managers = [self._manager(q) for _, q in pairs]
        try:
            t0 = time.perf_counter()
            await asyncio.gather(
                *(
                    qm.run(
                        batch_size=batch,
                        mode=QueueExecutionMode.drain,
                        # Only used when a dequeue came back empty; the 30 s default would
                        # stall drain mode when the queue empties with jobs still in flight.
                        dequeue_timeout=timedelta(milliseconds=50),
                    )
                    for qm in managers
                )
            )
            return n / (time.perf_counter() - t0)
        finally:
            for conn, _ in pairs:
                await conn.close()

    def drain(self, n: int, batch: int, consumers: int) -> float:
        self.preload(n)
        rate = asyncio.run(self._drain(n, batch, consumers))
        left = scalar(self.dsn, f"SELECT count(*) FROM {self.tables[0]}")
        done = scalar(
            self.dsn, f"SELECT count(*) FROM {self.tables[1]} WHERE status = 'successful'"
        )
        if left or done != n:
            raise RuntimeError(f"PgQueuer: {left} jobs left, {done}/{n} logged successful")
        return rate

    async def _latency(self, samples: int, gap: float) -> list[float]:
        self.reset()
        total = samples + LATENCY_WARMUP
        sent: dict[int, float] = {}
        lat: list[float] = []
        got = asyncio.Event()

        def on_job(job: Any) -> None:
            lat.append(time.perf_counter() - sent[int(job.payload)])
            got.set()

        cconn, cq = await self._queries()
        pconn, pq = await self._queries()
        qm = self._manager(cq, on_job)
        runner = asyncio.create_task(qm.run())
        try:
            await asyncio.sleep(0.3)
            for i in range(total):
                got.clear()
                sent[i] = time.perf_counter()
                await pq.enqueue("noop", str(i).encode())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(got.wait(), PROBE_TIMEOUT_S)
                await asyncio.sleep(gap)
        finally:
            qm.shutdown.set()
            await runner
            await cconn.close()
            await pconn.close()
        return lat[LATENCY_WARMUP:]

    def latency(self, samples: int, gap: float) -> list[float]:
        return asyncio.run(self._latency(samples, gap))


# -- procrastinate ----------------------------------------------------------------------------
class ProcrastinateBench:
    def __init__(self, dsn: str) -> None:
        from procrastinate import App, PsycopgConnector

        self.dsn = dsn
        self.on_job: Callable[[int], None] | None = None
        self.app = App(connector=PsycopgConnector(conninfo=dsn, min_size=1, max_size=CONSUMERS + 4))

        @self.app.task(name="noop")
        async def noop(seq: int) -> None:
            if self.on_job is not None:
                self.on_job(seq)

        self.task = noop

    async def _with_app(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        async with self.app.open_async():
            return await fn()

    def install(self) -> None:
        asyncio.run(self._with_app(self.app.schema_manager.apply_schema_async))

    def reset(self) -> None:
        sql(self.dsn, "TRUNCATE procrastinate_jobs CASCADE")

    async def _enqueue(self, n: int, batch: int) -> float:
        self.reset()
        args = [{"seq": i} for i in range(n)]
        t0 = time.perf_counter()
        if batch == 1:
            for a in args:
                await self.task.defer_async(**a)
        else:
            for part in chunks(args, batch):
                await self.task.batch_defer_async(*part)
        return n / (time.perf_counter() - t0)

    def enqueue_single(self, n: int) -> float:
        return asyncio.run(self._with_app(lambda: self._enqueue(n, 1)))

    def enqueue_batched(self, n: int) -> float:
        return asyncio.run(self._with_app(lambda: self._enqueue(n, ENQ_BATCH)))

    def preload(self, n: int) -> None:
        asyncio.run(self._with_app(lambda: self._enqueue(n, 1000)))
        sql(self.dsn, "VACUUM ANALYZE procrastinate_jobs")

    async def _drain(self, n: int, concurrency: int) -> float:
        t0 = time.perf_counter()
        await self.app.run_worker_async(
            wait=False,
            concurrency=concurrency,
            install_signal_handlers=False,
            delete_jobs="successful",  # like pgqueue's ack: the row goes away
            listen_notify=False,
        )
        return n / (time.perf_counter() - t0)

    def drain(self, n: int, concurrency: int) -> float:
        self.preload(n)
        rate = asyncio.run(self._with_app(lambda: self._drain(n, concurrency)))
        left = scalar(self.dsn, "SELECT count(*) FROM procrastinate_jobs")
        if left:
            raise RuntimeError(f"procrastinate: {left} jobs left")
        return rate

    async def _latency(self, samples: int, gap: float) -> list[float]:
        self.reset()
        total = samples + LATENCY_WARMUP
        sent: dict[int, float] = {}
        lat: list[float] = []
        got = asyncio.Event()

        def on_job(seq: int) -> None:
            lat.append(time.perf_counter() - sent[seq])
            got.set()

        self.on_job = on_job
        worker = asyncio.create_task(
            self.app.run_worker_async(
                concurrency=1, install_signal_handlers=False, delete_jobs="successful"
            )
        )
        try:
            await asyncio.sleep(0.5)
            for i in range(total):
                got.clear()
                sent[i] = time.perf_counter()
                await self.task.defer_async(seq=i)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(got.wait(), PROBE_TIMEOUT_S)
                await asyncio.sleep(gap)
        finally:
            self.on_job = None
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        return lat[LATENCY_WARMUP:]

    def latency(self, samples: int, gap: float) -> list[float]:
        return asyncio.run(self._with_app(lambda: self._latency(samples, gap)))


# -- sqs on moto (an emulator, not AWS) -------------------------------------------------------
class SqsBench:
    """The sqs QueueDriver as the aws profile builds it (make_driver), against moto. Each run
    has a fresh queue (and DLQ), made before its clock starts, so what it counts is its own."""

    def __init__(self, endpoint: str) -> None:
        from trace_platform.config import QueueBackend, Settings
        from trace_platform.queue import make_driver
        from trace_platform.queue.sqs import SqsQueue

        settings = Settings(
            queue_driver=QueueBackend.sqs,
            queue_max_attempts=20,
            sqs_endpoint_url=endpoint,
            sqs_queue_prefix=f"qb{secrets.token_hex(4)}-",
            sqs_access_key_id="test",
            sqs_secret_access_key="test",
        )
        q = make_driver(settings, dsn="")  # SQS needs no DSN
        assert isinstance(q, SqsQueue)
        self.q: SqsQueue = q
        self.runs = 0

    def close(self) -> None:
        self.q.close()

    def fresh(self) -> str:
        self.runs += 1
        name = f"{QUEUE}{self.runs}"
        self.q.resolve(name)  # created (with its DLQ) before the clock starts
        return name

    def counts(self, name: str) -> tuple[int, int, int]:
        """(visible, in flight, in the DLQ) as SQS counts them."""
        ref = self.q.resolve(name)
        keys = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        main = self.q.client.get_queue_attributes(QueueUrl=ref.url, AttributeNames=keys)
        dlq = self.q.client.get_queue_attributes(QueueUrl=ref.dlq_url, AttributeNames=keys[:1])
        a = main["Attributes"]
        return int(a[keys[0]]), int(a[keys[1]]), int(dlq["Attributes"][keys[0]])

    def enqueued(self, name: str, n: int) -> None:
        if (got := self.counts(name)) != (n, 0, 0):
            raise RuntimeError(f"sqs: {n} messages sent, the queue holds {got} (visible, ...)")

    def enqueue_single(self, n: int) -> float:
        name, msgs = self.fresh(), wakeups(n)
        t0 = time.perf_counter()
        for m in msgs:
            self.q.publish(name, m)
        rate = n / (time.perf_counter() - t0)
        self.enqueued(name, n)
        return rate

    def enqueue_batched(self, n: int) -> float:
        name, parts = self.fresh(), list(chunks(wakeups(n), ENQ_BATCH))
        t0 = time.perf_counter()
        for part in parts:
            self.q.publish_many(name, part)
        rate = n / (time.perf_counter() - t0)
        self.enqueued(name, n)
        return rate

    def drain(self, n: int, consumers: int, dupes: list[int]) -> float:
        """Batch 10, each batch acked by ack_many (one ReceiveMessage and one DeleteMessageBatch
        per batch, as a receive's folded ack makes them); ends on an empty receive. Refuses
        unless exactly the N messages sent came back (duplicates, which a standard queue may
        deliver, are counted into `dupes`), SQS accepted every delete, and the queue is
        empty."""
        name, msgs = self.fresh(), wakeups(n)
        for part in chunks(msgs, 1000):
            self.q.publish_many(name, part)
        self.enqueued(name, n)
        got: list[list[str]] = [[] for _ in range(consumers)]
        refused = [0] * consumers

        def consume(i: int) -> None:
            while batch := self.q.receive(name, 10, 60):
                refused[i] += len(batch) - self.q.ack_many(name, [m.receipt for m in batch])
                got[i].extend(m.payload["task_id"] for m in batch)

        elapsed = run_consumers(consumers, consume)
        received = [tid for ids in got for tid in ids]
        distinct = set(received)
        sent = {m["task_id"] for m in msgs}
        left = self.counts(name)
        if distinct != sent or left != (0, 0, 0) or any(refused):
            raise RuntimeError(
                f"sqs drained {len(distinct & sent)}/{n} of its messages "
                f"({len(distinct - sent)} not its own, {sum(refused)} deletes refused), queue "
                f"left {left} (visible, in flight, DLQ)"
            )
        dupes.append(len(received) - len(distinct))
        return n / elapsed

    def latency(self, samples: int, gap: float) -> list[float]:
        """Closed loop as the others: one consumer long polling (WaitTimeSeconds 20)."""
        name = self.fresh()
        sent: dict[str, float] = {}
        lat: list[float] = []
        stop_id = str(uuid4())
        got = threading.Event()
        seen: set[str] = set()

        def consume() -> None:
            while True:
                msgs = self.q.receive(name, 1, 30, wait_seconds=20)
                now = time.perf_counter()
                for m in msgs:
                    tid = m.payload["task_id"]
                    self.q.ack(name, m.receipt)
                    if tid == stop_id:
                        return
                    if tid in sent and tid not in seen:
                        seen.add(tid)
                        lat.append(now - sent[tid])
                    got.set()

        consumer = threading.Thread(target=consume)
        consumer.start()
        time.sleep(0.3)  # let it go idle in its long poll
        send_probes(lambda m: self.q.publish(name, m), samples + LATENCY_WARMUP, gap, sent, got)
        self.q.publish(name, {"kind": "task_wakeup", "task_id": stop_id})
        consumer.join(30)
        if consumer.is_alive():
            raise RuntimeError("sqs: the latency consumer never received its stop message")
        return lat[LATENCY_WARMUP:]


# -- driver -----------------------------------------------------------------------------------
def put_latency(res: Results, system: str, samples: list[float], expected: int) -> None:
    note = "" if len(samples) == expected else f"{len(samples)}/{expected} samples"
    res.put("lat50", system, percentile(samples, 0.50) * 1000, note)
    res.put("lat99", system, percentile(samples, 0.99) * 1000, note)


def bench_ours(dsn: str, cfg: Config, res: Results, system: str = OURS) -> None:
    migrate(dsn)
    ours = Ours(dsn, relaxed_acks=system == OURS)
    try:
        r = cfg.repeats
        log(f"{system}: enqueue")
        res.put("enq1", system, median_of(r, lambda: ours.enqueue_single(cfg.single_n)))
        res.put("enq100", system, median_of(r, lambda: ours.enqueue_batched(cfg.n)))
        log(f"{system}: dequeue")
        res.put(
            "deq1_b10_ack1",
            system,
            median_of(r, lambda: ours.drain(cfg.single_n, 10, 1, ack="each")),
            f"one commit per message: N={cfg.single_n}",
        )
        res.put(
            "deq1_b10_many",
            system,
            median_of(r, lambda: ours.drain(cfg.n, 10, 1, ack="many")),
            "ack_many after each batch: two commits per batch",
        )
        for key, batch, consumers in DRAINS:
            res.put(key, system, median_of(r, lambda b=batch, c=consumers: ours.drain(cfg.n, b, c)))
        log(f"{system}: latency")
        put_latency(
            res, system, ours.latency(cfg.latency_samples, cfg.latency_gap_s), cfg.latency_samples
        )
    finally:
        ours.close()


def bench_bare(dsn: str, cfg: Config, res: Results) -> None:
    bare = Bare(dsn)
    r = cfg.repeats
    log(f"{BARE}: enqueue")
    res.put("enq1", BARE, median_of(r, lambda: bare.enqueue_single(cfg.single_n)))
    res.put("enq100", BARE, median_of(r, lambda: bare.enqueue_batched(cfg.n)))
    log(f"{BARE}: dequeue")
    for key, batch, consumers in DRAINS:
        res.put(key, BARE, median_of(r, lambda b=batch, c=consumers: bare.drain(cfg.n, b, c)))
    log(f"{BARE}: latency")
    put_latency(
        res, BARE, bare.latency(cfg.latency_samples, cfg.latency_gap_s), cfg.latency_samples
    )


def paired_with_bare(dsn: str, cfg: Config, res: Results) -> None:
    """The durable pgqueue's drains against the bare loop's, run in pairs one right after the
    other (which goes first alternates): the machine's speed drifts by 20-30% within minutes
    here, and the columns above are measured minutes apart, so their ratio carries the drift.
    A pair's ratio does not; the report gives their median and range."""
    ours, bare = Ours(dsn, relaxed_acks=False), Bare(dsn)
    try:
        log(f"{OURS_DURABLE} and {BARE}: {cfg.pairs} interleaved pairs of each drain")
        for i in range(cfg.pairs):
            for key, batch, consumers in DRAINS:
                if i % 2:
                    theirs = bare.drain(cfg.n, batch, consumers)
                    mine = ours.drain(cfg.n, batch, consumers)
                else:
                    mine = ours.drain(cfg.n, batch, consumers)
                    theirs = bare.drain(cfg.n, batch, consumers)
                res.pairs.setdefault(key, []).append(mine / theirs)
    finally:
        ours.close()


def bench_pgqueuer(dsn: str, cfg: Config, res: Results) -> None:
    pq = PgQueuerBench(dsn)
    asyncio.run(pq.install())
    r = cfg.repeats
    log(f"{PGQUEUER}: enqueue")
    res.put("enq1", PGQUEUER, median_of(r, lambda: pq.enqueue_single(cfg.single_n)))
    res.put("enq100", PGQUEUER, median_of(r, lambda: pq.enqueue_batched(cfg.n)))
    log(f"{PGQUEUER}: dequeue")
    for key, batch, consumers in DRAINS:
        res.put(key, PGQUEUER, median_of(r, lambda b=batch, c=consumers: pq.drain(cfg.n, b, c)))
    log(f"{PGQUEUER}: latency")
    put_latency(
        res, PGQUEUER, pq.latency(cfg.latency_samples, cfg.latency_gap_s), cfg.latency_samples
    )


def bench_procrastinate(dsn: str, cfg: Config, res: Results) -> None:
    pr = ProcrastinateBench(dsn)
    pr.install()
    r = cfg.repeats
    log(f"{PROCRASTINATE}: enqueue")
    res.put("enq1", PROCRASTINATE, median_of(r, lambda: pr.enqueue_single(cfg.single_n)))
    res.put("enq100", PROCRASTINATE, median_of(r, lambda: pr.enqueue_batched(cfg.n)))
    log(f"{PROCRASTINATE}: dequeue (N={cfg.proc_n}, no batch setting)")
    one = median_of(r, lambda: pr.drain(cfg.proc_n, 1))
    many = median_of(r, lambda: pr.drain(cfg.proc_n, CONSUMERS))
    note = f"no batch setting; N={cfg.proc_n}"
    for key, _, consumers in DRAINS:
        res.put(key, PROCRASTINATE, one if consumers == 1 else many, note)
    log(f"{PROCRASTINATE}: latency")
    put_latency(
        res, PROCRASTINATE, pr.latency(cfg.latency_samples, cfg.latency_gap_s), cfg.latency_samples
    )


def bench_sqs(endpoint: str, cfg: Config, res: Results) -> None:
    sq = SqsBench(endpoint)
    r = cfg.repeats
    try:
        log(f"{SQS}: enqueue")
        res.put(
            "enq1",
            SQS,
            median_of(r, lambda: sq.enqueue_single(cfg.sqs_single_n)),
            f"sqs: N={cfg.sqs_single_n}",
        )
        res.put(
            "enq100",
            SQS,
            median_of(r, lambda: sq.enqueue_batched(cfg.sqs_n)),
            f"sqs: N={cfg.sqs_n}; a publish_many of {ENQ_BATCH} is "
            f"{ENQ_BATCH // 10} SendMessageBatch calls of 10",
        )
        log(f"{SQS}: dequeue (batch 10: SQS's most per receive)")
        for key, batch, consumers in DRAINS:
            if batch != 10:
                continue
            dupes: list[int] = []
            rate = median_of(r, lambda c=consumers, d=dupes: sq.drain(cfg.sqs_n, c, d))
            note = f"sqs: N={cfg.sqs_n}; one ReceiveMessage + one DeleteMessageBatch per batch"
            if any(dupes):
                note += f"; duplicate deliveries per run {dupes} (counted once)"
            res.put(key, SQS, rate, note)
        log(f"{SQS}: latency")
        put_latency(
            res, SQS, sq.latency(cfg.latency_samples, cfg.latency_gap_s), cfg.latency_samples
        )
    finally:
        sq.close()


DRAINS = [
    ("deq1_b10", 10, 1),
    ("deq1_b100", 100, 1),
    ("deq4_b10", 10, CONSUMERS),
    ("deq4_b100", 100, CONSUMERS),
]


def machine_info(dsn: str) -> list[tuple[str, str]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        settings = {
            name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in (
                "server_version",
                "fsync",
                "synchronous_commit",
                "wal_sync_method",
                "shared_buffers",
            )
        }
    return [
        *describe(),
        ("postgres", settings["server_version"]),
        (
            "durability",
            f"fsync={settings['fsync']} synchronous_commit={settings['synchronous_commit']} "
            f"wal_sync_method={settings['wal_sync_method']}",
        ),
        ("shared_buffers", settings["shared_buffers"]),
        (
            "clients",
            f"psycopg {version('psycopg')}, asyncpg {installed('asyncpg')} "
            f"(PgQueuer), psycopg_pool {version('psycopg-pool')}",
        ),
    ]


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:.2f}"
    return f"{value:,.0f}"


def print_report(info: list[tuple[str, str]], cfg: Config, res: Results, wall: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=250)  # the widest table (11 columns) unwrapped
    meta = Table(title="Machine", show_header=False)
    for k, v in info:
        meta.add_row(k, v)
    meta.add_row(
        "run",
        f"N={cfg.n} (single-message enqueue N={cfg.single_n}, procrastinate dequeue "
        f"N={cfg.proc_n}), median of {cfg.repeats}, latency {cfg.latency_samples} samples "
        f"sent one at a time, {cfg.latency_gap_s * 1000:g} ms after the previous was received"
        + (
            f"; sqs: N={cfg.sqs_n}, single-message enqueue N={cfg.sqs_single_n}"
            if cfg.sqs
            else "; sqs column skipped (--no-sqs)"
        ),
    )
    console.print(meta)

    table = Table(title="Queue benchmark (same server, same run)")
    table.add_column("metric")
    table.add_column("unit")
    for s in SYSTEMS:
        table.add_column(s, justify="right")
    for p in PEERS:
        table.add_column(f"durable pgqueue / {p.split()[0]}", justify="right")
    marks: dict[str, str] = {}
    for m in METRICS:
        row = res.values.get(m.key, {})
        cells = []
        for s in SYSTEMS:
            cell = fmt(row.get(s), m.unit)
            note = res.notes.get((m.key, s))
            if note and s in row:
                mark = marks.setdefault(note, "*" * (len(marks) + 1))
                cell += mark
            cells.append(cell)
        ratios = []
        for p in PEERS:  # like for like: the durable column against the durable peers
            a, b = row.get(OURS_DURABLE), row.get(p)
            ratios.append(f"{a / b:.2f}x" if a and b else "-")
        table.add_row(m.label, m.unit, *cells, *ratios)
    console.print(table)
    for system in SYSTEMS:
        console.print(f"  {system}: {DURABILITY[system]}")
    for note, mark in marks.items():
        console.print(f"  {mark} {note}")
    console.print(
        "  msg/s: higher is better, ratio > 1 favours pgqueue; "
        "ms: lower is better, ratio < 1 favours pgqueue. The ratios compare the durable "
        "pgqueue column, committed as the peers commit."
    )
    console.print(
        "  PgQueuer completes through a buffered log (one statement per batch, across jobs); "
        "procrastinate runs with delete_jobs=successful; pgqueue acks each batch in its "
        "next receive's statement (one commit per batch) unless stated."
    )
    if SQS in res.values.get("enq1", {}):
        console.print(
            f"  {SQS}: moto (a local emulator in its own process), not AWS: not comparable "
            "with AWS's latency or throughput. Its figures are the sqs driver and boto3 over "
            "HTTP on loopback against moto's Python server on the same 2 cores, with moto's "
            "per-message retention check made constant-time (as the test suite's sqs module "
            "runs it) and its deletes one at a time (unlocked, two at once lose one); moto's "
            "other costs grow with the queue (each send counts every message of it), so "
            "its figures hold at their N only; "
            "batch 100 does not apply (10 is SQS's most per receive)."
        )
    if res.pairs:
        paired = Table(title=f"Durable pgqueue / {BARE}, {cfg.pairs} interleaved pairs of drains")
        for col in ("metric", "median ratio", "range"):
            paired.add_column(col, justify="left" if col == "metric" else "right")
        labels = {m.key: m.label for m in METRICS}
        for key, ratios in res.pairs.items():
            paired.add_row(
                labels[key],
                f"{statistics.median(ratios):.2f}x",
                f"{min(ratios):.2f}-{max(ratios):.2f}x",
            )
        console.print(paired)
    console.print(f"  wall time {wall:.0f} s")


def parse_args(argv: list[str] | None) -> Config:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-n", "--messages", type=int, default=20_000, help="messages per run")
    ap.add_argument(
        "--single-n",
        type=int,
        default=2_000,
        help="messages for the one-message-per-transaction runs (enqueue, per-message ack)",
    )
    ap.add_argument(
        "--procrastinate-n",
        type=int,
        default=None,
        help="messages for procrastinate's dequeue runs (it does <1k/s here; default min(N, 2000))",
    )
    ap.add_argument("-r", "--repeats", type=int, default=3, help="runs per figure (median)")
    ap.add_argument("--latency-samples", type=int, default=500)
    ap.add_argument(
        "--latency-gap-ms",
        type=float,
        default=2.0,
        help="pause after each latency probe is received before sending the next (probes are "
        "closed-loop, so a slow consumer is never measured queueing behind itself)",
    )
    ap.add_argument(
        "--pairs",
        type=int,
        default=5,
        help="interleaved pairs of drains, durable pgqueue against the bare loop (0: none)",
    )
    ap.add_argument(
        "--sqs-n",
        type=int,
        default=1_000,
        help="messages per sqs enqueue-batched and drain run (moto deletes a message by scanning "
        "its whole queue: its drain slows with N)",
    )
    ap.add_argument(
        "--sqs-single-n", type=int, default=500, help="messages for sqs's one-a-call enqueue"
    )
    ap.add_argument(
        "--no-sqs", action="store_true", help="skip the sqs column (moto's server not started)"
    )
    ap.add_argument("--quick", action="store_true", help="N=5000, 1 repeat")
    a = smoke.parse_args(
        ap,
        argv,
        messages=200,
        single_n=50,
        procrastinate_n=50,
        repeats=1,
        latency_samples=5,
        pairs=1,
        sqs_n=100,
        sqs_single_n=20,
    )
    if a.smoke:  # the warm-up probes are most of a smoke run's latency samples
        global LATENCY_WARMUP
        LATENCY_WARMUP = 2
    if a.quick:
        a.messages, a.repeats, a.single_n = 5_000, 1, min(a.single_n, 1_000)
    return Config(
        n=a.messages,
        single_n=min(a.single_n, a.messages),
        proc_n=a.procrastinate_n or min(a.messages, 2_000 if not a.quick else 1_000),
        repeats=a.repeats,
        latency_samples=a.latency_samples,
        latency_gap_s=a.latency_gap_ms / 1000,
        pairs=a.pairs,
        sqs_n=a.sqs_n,
        sqs_single_n=a.sqs_single_n,
        sqs=not a.no_sqs,
    )


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    # "App is instantiated in the main Python module": true, and harmless for a benchmark.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    load_before = loadavg()
    wall0 = time.perf_counter()
    pg = EmbeddedPostgres(
        Path(f"/tmp/trace-bench-pg-{secrets.token_hex(4)}"), durable=smoke.durable()
    )
    res = Results()
    try:
        log(f"starting Postgres in {pg.root}")
        pg.start()
        dbs = {s: f"bench_{s}" for s in ("pgqueue", "pgqueuer", "procrastinate")}
        sql(pg.dsn("postgres"), *(f'CREATE DATABASE "{d}"' for d in dbs.values()))
        info = machine_info(pg.dsn("postgres"))
        bench_ours(pg.dsn(dbs["pgqueue"]), cfg, res)
        bench_ours(pg.dsn(dbs["pgqueue"]), cfg, res, OURS_DURABLE)
        bench_bare(pg.dsn(dbs["pgqueue"]), cfg, res)
        paired_with_bare(pg.dsn(dbs["pgqueue"]), cfg, res)
        if installed("pgqueuer") and installed("asyncpg"):
            bench_pgqueuer(pg.dsn(dbs["pgqueuer"]), cfg, res)
        else:
            log(f"{PGQUEUER}: not installed (the bench extra), its side skipped")
        if installed("procrastinate"):
            bench_procrastinate(pg.dsn(dbs["procrastinate"]), cfg, res)
        else:
            log(f"{PROCRASTINATE}: not installed (the bench extra), its side skipped")
        if cfg.sqs:
            # moto's retention check in constant time, as the test suite's sqs module runs it,
            # and its deletes one at a time (bench/moto_server.py says why).
            with moto_server(queue_fixes=True) as endpoint:
                bench_sqs(endpoint, cfg, res)
    finally:
        log("destroying the cluster")
        pg.destroy()
    info.append(("load average", f"{load_before} before, {loadavg()} after (other work skews)"))
    print_report(info, cfg, res, time.perf_counter() - wall0)
    return 0


if __name__ == "__main__":
    smoke.main(main)
