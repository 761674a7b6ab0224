"""The platform's state as gauges, read from Postgres at each scrape (a custom Collector).

Every figure comes from a statement that reads an index or a small table (db/sql/metrics.sql),
each in its own transaction under a statement_timeout: a read that fails or runs out of time
is left out of that scrape (and counted in trace_metrics_read_errors_total), never the others.
Tasks by status are exact for live work (queued, buffered, running: the live status index) and
estimated for all statuses from the planner's statistics of the status table's partitions (a
year of finished tasks is hundreds of millions of rows: no scrape counts them)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import Counter
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from psycopg_pool import ConnectionPool

from trace_platform.store.calls import Row
from trace_platform.store.metrics import MetricsStore

log = logging.getLogger(__name__)

LIVE_STATUSES = ("queued", "buffered", "running")
STATUSES = ("queued", "buffered", "running", "succeeded", "failed", "canceled")
WORKER_STATES = ("alive", "stopped", "dead")
DELIVERY_STATES = ("pending", "sending")
QUEUE_STATES = ("ready", "delayed", "leased")
# A scrape's reads: each bounded by this, and by this wait for a connection of the pool.
READ_TIMEOUT_MS = 2000
POOL_WAIT_SECONDS = 2.0
# Series per buffered dataset (its sink backlog, its own queue): any user can declare many, so
# only the NAMED largest are named and the rest are summed under OTHER (a bounded scrape, and
# totals still equal to the database's).
NAMED = 20
OTHER = "_other"

Read = Callable[[MetricsStore], list[Metric]]


class StateCollector:
    """`queues`: queue names always shown (at 0 when empty: the task and lambda queues), besides
    every queue pgqueue holds messages of; `depths`: the sqs driver's approximate depths (name ->
    {state: n}), when the queue is SQS (pgqueue's are read from its tables)."""

    def __init__(
        self,
        pool: ConnectionPool,
        *,
        queues: tuple[str, ...] = (),
        pgqueue: bool = True,
        depths: Callable[[list[str]], dict[str, dict[str, int]]] | None = None,
        timeout_ms: int = READ_TIMEOUT_MS,
    ) -> None:
        self.pool = pool
        self.queues = queues
        self.depths = depths
        self.timeout_ms = timeout_ms
        self.errors = Counter(
            "trace_metrics_read_errors",
            "Scrape-time reads that failed or ran out of time (their figures were left out)",
            ["read"],
            registry=None,
        )
        self.reads: dict[str, Read] = {
            "tasks": _tasks,
            "tasks_estimated": _tasks_estimated,
            "outbox": _outbox,
            "deliveries": _deliveries,
            "sink": _sink,
            "workers": _workers,
        }
        if pgqueue:
            self.reads["queues"] = self._pgqueue
        for name in (*self.reads, *(("queues",) if depths is not None else ())):
            self.errors.labels(name)
        # One read of the state at a time, shared: scrapes at once (anyone on the operators'
        # network can open many) take one connection of the API's pool, never all of it.
        self._reading = threading.Lock()
        self._last: tuple[float, list[Metric]] = (float("-inf"), [])

    def describe(self) -> list[Metric]:
        return []  # registering reads nothing; a scrape does

    def collect(self) -> Iterator[Metric]:
        """The state as read by this scrape, or by the read that ended after this scrape
        began (one that was under way when it came: its figures are as fresh)."""
        asked = time.monotonic()
        with self._reading:
            ended, families = self._last
            if ended < asked:
                families = list(self._read())
                self._last = (time.monotonic(), families)
        yield from families

    def _read(self) -> Iterator[Metric]:
        seconds = GaugeMetricFamily(
            "trace_metrics_read_seconds", "How long each scrape-time read took", labels=["read"]
        )
        for name, read in self.reads.items():
            began = time.monotonic()
            try:
                with self.pool.connection(timeout=POOL_WAIT_SECONDS) as conn, conn.transaction():
                    store = MetricsStore(conn)
                    store.bound(self.timeout_ms)
                    families = read(store)
            except Exception as e:  # this read's figures are left out; the others are not
                log.warning("metrics: the %s read failed: %s", name, e)
                self.errors.labels(name).inc()
                continue
            seconds.add_metric([name], time.monotonic() - began)
            yield from families
        if self.depths is not None:
            yield from self._sqs(seconds)
        yield seconds
        yield from self.errors.collect()

    def _pgqueue(self, store: MetricsStore) -> list[Metric]:
        counts: dict[str, dict[str, int]] = {q: dict.fromkeys(QUEUE_STATES, 0) for q in self.queues}
        oldest: dict[str, float] = dict.fromkeys(self.queues, 0.0)
        for r in store.pgqueue_messages().fetchall():
            q = counts.setdefault(r["queue_name"], dict.fromkeys(QUEUE_STATES, 0))
            q["ready"], q["delayed"], q["leased"] = r["ready"], r["delayed"], r["leased"]
            oldest[r["queue_name"]] = max(0.0, r["oldest_ready_seconds"] or 0.0)
        for r in store.pgqueue_leased_batches().fetchall():
            q = counts.setdefault(r["queue_name"], dict.fromkeys(QUEUE_STATES, 0))
            q["leased"] += r["leased"]
        dead = {r["queue_name"]: r["n"] for r in store.pgqueue_dead().fetchall()}
        zero = dict.fromkeys(QUEUE_STATES, 0)
        size = {q: sum(counts.get(q, zero).values()) + dead.get(q, 0) for q in counts | dead}
        ranked = sorted(set(size) - set(self.queues), key=lambda q: (-size[q], q))
        for q in ranked[NAMED:]:  # the task and lambda queues are always named
            rest = counts.setdefault(OTHER, dict(zero))
            for state, n in counts.pop(q, zero).items():
                rest[state] += n
            oldest[OTHER] = max(oldest.get(OTHER, 0.0), oldest.pop(q, 0.0))
            dead[OTHER] = dead.get(OTHER, 0) + dead.pop(q, 0)
        messages = GaugeMetricFamily(
            "trace_queue_messages",
            "Messages on each queue: ready (to be received now), delayed (visible later), "
            "leased (received, not yet acked)",
            labels=["queue", "state"],
        )
        age = GaugeMetricFamily(
            "trace_queue_oldest_ready_seconds",
            "How long the oldest ready message of each queue has waited to be received",
            labels=["queue"],
        )
        dead_letters = GaugeMetricFamily(
            "trace_queue_dead_letters", "Dead-lettered messages kept, by queue", labels=["queue"]
        )
        for name in sorted(counts.keys() | dead.keys()):
            for state, n in counts.get(name, dict.fromkeys(QUEUE_STATES, 0)).items():
                messages.add_metric([name, state], n)
            age.add_metric([name], oldest.get(name, 0.0))
            dead_letters.add_metric([name], dead.get(name, 0))
        return [messages, age, dead_letters]

    def _sqs(self, seconds: GaugeMetricFamily) -> Iterator[Metric]:
        """SQS's approximate counts of the named queues (one GetQueueAttributes each); SQS tells
        no message's age (CloudWatch's ApproximateAgeOfOldestMessage does)."""
        assert self.depths is not None
        began = time.monotonic()
        try:
            depths = self.depths(list(self.queues))
        except Exception as e:
            log.warning("metrics: the sqs depth read failed: %s", e)
            self.errors.labels("queues").inc()
            return
        messages = GaugeMetricFamily(
            "trace_queue_messages",
            "Messages on each queue (SQS: its approximate counts): ready, delayed, leased",
            labels=["queue", "state"],
        )
        for name, states in sorted(depths.items()):
            for state in QUEUE_STATES:
                messages.add_metric([name, state], states.get(state, 0))
        yield messages
        seconds.add_metric(["queues"], time.monotonic() - began)


def _gauge(
    name: str, doc: str, values: list[tuple[list[str], float]], labels: list[str] | None = None
) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=labels or [])
    for key, value in values:
        g.add_metric(key, value)
    return g


def _tasks(store: MetricsStore) -> list[Metric]:
    counts = dict.fromkeys(LIVE_STATUSES, 0)
    counts.update({r["status"]: r["n"] for r in store.live_tasks().fetchall()})
    return [
        _gauge(
            "trace_tasks",
            "Live tasks by status, exactly (queued, buffered, running)",
            [([s], n) for s, n in counts.items()],
            ["status"],
        )
    ]


def estimated_statuses(rows: list[Row]) -> dict[str, float]:
    """Tasks by status as the planner estimates them: each partition's row estimate times the
    frequency its last ANALYZE found of each status (a partition never analysed counts 0; a
    status too rare in a partition to be among its most common values counts 0 there)."""
    out = dict.fromkeys(STATUSES, 0.0)
    for r in rows:
        if r["reltuples"] is None or r["reltuples"] <= 0 or not r["vals"]:
            continue
        for value, freq in zip(r["vals"], r["freqs"], strict=True):
            if value in out:
                out[value] += freq * r["reltuples"]
    return {s: float(round(n)) for s, n in out.items()}


def _tasks_estimated(store: MetricsStore) -> list[Metric]:
    est = estimated_statuses(store.status_statistics().fetchall())
    return [
        _gauge(
            "trace_tasks_estimated",
            "Tasks by status (every status), estimated from the status table's statistics as "
            "of each partition's last ANALYZE",
            [([s], n) for s, n in est.items()],
            ["status"],
        )
    ]


def _outbox(store: MetricsStore) -> list[Metric]:
    row: Any = store.outbox_lag().fetchone()
    return [
        _gauge("trace_outbox_unsent", "Wake-ups written, not yet published", [([], row["unsent"])]),
        _gauge(
            "trace_outbox_oldest_unsent_seconds",
            "Age of the oldest wake-up not yet published (0: none)",
            [([], max(0.0, row["oldest_seconds"] or 0.0))],
        ),
    ]


def _deliveries(store: MetricsStore) -> list[Metric]:
    rows = {r["status"]: r for r in store.delivery_backlog().fetchall()}
    pending = rows.get("pending")
    ages = [r["oldest_seconds"] for r in rows.values()]
    return [
        _gauge(
            "trace_deliveries",
            "Alert deliveries not yet done: pending (waiting for their next attempt), "
            "sending (leased by a Delivery Service)",
            [([s], rows[s]["n"] if s in rows else 0) for s in DELIVERY_STATES],
            ["status"],
        ),
        _gauge(
            "trace_delivery_oldest_seconds",
            "Age of the oldest delivery not yet done (0: none)",
            [([], max([0.0, *ages]))],
        ),
        _gauge(
            "trace_delivery_overdue_seconds",
            "How far past its due time the most overdue pending delivery is (0: none)",
            [([], pending["overdue_seconds"] if pending else 0.0)],
        ),
    ]


def _sink(store: MetricsStore) -> list[Metric]:
    rows = sorted(store.sink_backlog().fetchall(), key=lambda r: (-r["n"], r["dataset_uuid"]))
    if len(rows) > NAMED:
        rest = rows[NAMED:]
        other = {
            "dataset_uuid": OTHER,
            "n": sum(r["n"] for r in rest),
            "oldest_seconds": max(r["oldest_seconds"] for r in rest),
        }
        rows = [*rows[:NAMED], other]
    return [
        _gauge(
            "trace_sink_pending_batches",
            "Buffered batches published, not yet loaded by a sink, by dataset (the 20 largest "
            "backlogs; the rest summed as _other)",
            [([r["dataset_uuid"]], r["n"]) for r in rows],
            ["dataset_uuid"],
        ),
        _gauge(
            "trace_sink_oldest_pending_seconds",
            "Age of each dataset's oldest batch not yet loaded",
            [([r["dataset_uuid"]], max(0.0, r["oldest_seconds"])) for r in rows],
            ["dataset_uuid"],
        ),
    ]


def _workers(store: MetricsStore) -> list[Metric]:
    rows = {r["state"]: r for r in store.worker_registry().fetchall()}
    return [
        _gauge(
            "trace_workers",
            "Workers in the registry by state (ended ones are kept a week)",
            [([s], rows[s]["n"] if s in rows else 0) for s in WORKER_STATES],
            ["state"],
        ),
        _gauge(
            "trace_worker_slots",
            "Tasks the live workers can run at once, together",
            [([], rows["alive"]["slots"] if "alive" in rows else 0)],
        ),
    ]


def cache_families(stats: dict[str, Any]) -> list[Metric]:
    """This process's caches (`trace_platform.cache.stats()`), by name."""
    hits = CounterMetricFamily("trace_cache_hits", "Cache lookups answered", labels=["cache"])
    misses = CounterMetricFamily("trace_cache_misses", "Cache lookups missed", labels=["cache"])
    evictions = CounterMetricFamily(
        "trace_cache_evictions", "Entries evicted to stay within size", labels=["cache"]
    )
    invalidations = CounterMetricFamily(
        "trace_cache_invalidations", "Invalidations received", labels=["cache"]
    )
    size = GaugeMetricFamily("trace_cache_entries", "Entries held", labels=["cache"])
    for name, s in sorted(stats.items()):
        hits.add_metric([name], s.hits)
        misses.add_metric([name], s.misses)
        evictions.add_metric([name], s.evictions)
        invalidations.add_metric([name], s.invalidations)
        size.add_metric([name], s.size)
    return [hits, misses, evictions, invalidations, size]
