"""The sink loop (`trace sink`): leases buffer-record messages from each buffered dataset's
own queue, loads each batch, and reports the outcome through the Dispatcher. Safe to run many:
a message is leased by one sink at a time, the record is settled once (the first to finish),
and the upsert is idempotent, so a sink killed anywhere leaves the batch to the next try
with no row lost and none doubled."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg

from trace_platform import faults
from trace_platform.alerts.datasets import ALERT_EVENTS
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.objectstore import NoSuchKey, ObjectStore, ObjectStoreError
from trace_platform.queue import QueueDriver
from trace_platform.queue.driver import Message, QueueUnavailable
from trace_platform.queue.payloads import BufferRecord, PayloadError, decode
from trace_platform.sink.batch import BatchRefused, checking, parse
from trace_platform.store import sink as sink_sql

log = logging.getLogger("trace.sink")

REFRESH_SECONDS = 10.0  # how often a sink looks for buffered datasets deployed since
FIRST_WAIT = 0.05  # the first idle pause after work, doubling up to `idle_seconds`


def _next_wait(last: float, idle_seconds: float) -> float:
    """Batches come in bursts (a landed batch's readers publish theirs moments later: an
    alert's routed deliveries): just after work a sink looks again soon, then backs off to
    `idle_seconds`. A fixed 0.5 s pause was the largest leg of an alert's latency
    (bench/act_bench.py: 0.49 s median from a routed batch's publish to its landing)."""
    return min(idle_seconds, max(FIRST_WAIT, last * 2))


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a batch loads: its rows are thousands of small
    acyclic dicts and lists, which reference counting frees, and the collector's passes over
    them were an eighth of the sink's CPU (act_bench's transfers: 15 -> 13 us a row)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Sink:
    def __init__(
        self,
        dispatcher: Dispatcher,
        driver: QueueDriver,
        store: ObjectStore,
        data_dsn: str,
        *,
        datasets: Sequence[str] = (),
        visibility_seconds: float = 60.0,
        batch: int = 10,
        max_tries: int = 5,
        max_batch_bytes: int | None = None,
    ) -> None:
        self.buffers = dispatcher.buffers
        self.driver = driver
        self.store = store
        self.data_dsn = data_dsn
        self.names = list(datasets)
        self.visibility = visibility_seconds
        self.batch = batch
        self.max_tries = max_tries
        # What one batch may be, stored or decoded, whatever its dataset declares.
        self.max_batch_bytes = max_batch_bytes or dispatcher.settings.sink_max_batch_bytes
        self._datasets: list[dict[str, Any]] = []
        self._tables: set[str] = set()  # made (or found) by this sink
        self._refreshed = 0.0
        self._conn: psycopg.Connection[Any] | None = None

    # -- the loop -------------------------------------------------------------------------
    def serve(self, stop: threading.Event, idle_seconds: float = 0.5) -> None:
        wait = 0.0
        while not stop.is_set():
            try:
                handled = self.step()
            except (psycopg.Error, ObjectStoreError, QueueUnavailable) as e:  # one is away
                log.warning("sink: %s; retrying", e)
                self._close()
                handled = 0
            wait = 0.0 if handled else _next_wait(wait, idle_seconds)
            if wait:
                stop.wait(wait)
        self._close()

    def step(self) -> int:
        """One pass over every dataset's queue; returns the messages handled."""
        self._refresh()
        handled = 0
        for ds in self._datasets:
            msgs = self.driver.receive(ds["queue_name"], self.batch, self.visibility)
            for msg in msgs:
                self.handle(ds, msg)
                handled += 1
        return handled

    def drain(self, timeout: float = 30.0) -> int:
        """Passes until a pass finds nothing (tests, `trace sink --once`)."""
        total, deadline = 0, time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = self.step()
            total += n
            if not n:
                break
        return total

    def _refresh(self) -> None:
        if self._datasets and time.monotonic() - self._refreshed < REFRESH_SECONDS:
            return
        datasets = self.buffers.datasets(self.names)
        self._refreshed = time.monotonic()
        self._datasets = []
        for ds in datasets:  # readable (empty) before its first batch lands
            try:
                self._ensure(ds)
            except psycopg.DatabaseError as e:
                if isinstance(e, psycopg.OperationalError):
                    raise  # the data database is away: serve() retries
                # One dataset whose table cannot be made never stops every other's sink.
                log.error("sink: table of '%s' (%s) not made: %s", ds["name"], ds["org_id"], e)
                self._close()
                continue
            self._datasets.append(ds)

    # -- one message ---------------------------------------------------------------------
    def handle(self, ds: dict[str, Any], msg: Message) -> str:
        """Lands, refuses or leaves the message's record; returns what happened."""
        queue = ds["queue_name"]
        try:
            payload = decode(msg.payload)
        except PayloadError as e:
            log.warning("sink: dropping a malformed message on %s: %s", queue, e)
            self.driver.ack(queue, msg.receipt)
            return "malformed"
        if not isinstance(payload, BufferRecord) or payload.dataset_uuid != ds["dataset_uuid"]:
            self.driver.ack(queue, msg.receipt)  # not this queue's: nothing to load
            return "foreign"
        try:
            with _collector_paused():
                outcome = self._load(payload.record_id)
        except (psycopg.OperationalError, ObjectStoreError) as e:
            log.warning("sink: record %s not loaded yet: %s", payload.record_id, e)
            self._close()
            self._retry(queue, msg, payload.record_id, e)
            return "retry"
        except Exception as e:  # one record's failure never stops the sink of every dataset
            if isinstance(e, psycopg.Error) and not isinstance(e, psycopg.DatabaseError):
                raise  # the state store or data connection itself is away: serve() retries
            log.exception("sink: record %s failed", payload.record_id)
            self._close()
            self._retry(queue, msg, payload.record_id, e)
            return "retry"
        self.driver.ack(queue, msg.receipt)
        return outcome

    def _retry(self, queue: str, msg: Message, record_id: UUID, e: Exception) -> None:
        why = f"{type(e).__name__}: {e}"[:2000]
        try:
            self.buffers.failed_try(record_id, why)
        except psycopg.Error as err:  # the state store is away too: the try still counts
            log.warning("sink: could not note why record %s failed: %s", record_id, err)
        self.driver.nack(queue, msg.receipt, why, delay_seconds=1)

    def _load(self, record_id: UUID) -> str:
        rec = self.buffers.record(record_id)
        if rec is None or rec["status"] != "pending":
            return "done"  # settled by an earlier delivery or another sink
        if rec["sink_attempts"] > self.max_tries:
            last = f": {rec['error']}" if rec.get("error") else ""
            self.buffers.dead(record_id, f"not loaded after {self.max_tries} tries{last}")
            return "dead"
        try:
            names, rows = self._read(rec)
            if rec.get("platform") == ALERT_EVENTS.name:
                rows = _own_alerts(rec, names, rows)
            loaded, values = self._upsert(rec, names, rows)
        except BatchRefused as e:  # a row refused mid-load: its transaction rolled back
            self.buffers.dead(record_id, str(e))
            log.info("sink: batch %s of '%s' refused: %s", record_id, rec["name"], e)
            return "dead"
        except (
            psycopg.errors.DataError,
            psycopg.errors.IntegrityError,
            psycopg.errors.ProgramLimitExceeded,
        ) as e:  # the table refused a value the checks let through: the batch's, for good
            why = e.diag.message_primary or str(e)
            self.buffers.dead(record_id, f"the table refused the batch: {why}")
            log.info("sink: batch %s of '%s' refused by its table: %s", record_id, rec["name"], e)
            return "dead"
        faults.point("sink.after_upsert")  # chaos: rows committed, the record not yet settled
        self.buffers.landed(record_id, len(values), loaded, rows=(names, values))
        return "loaded"

    def _read(self, rec: dict[str, Any]) -> tuple[list[str], Iterator[list[Any]]]:
        """The batch, never more than its bound read or decoded (the artifact is the
        operator's: it may be larger than it was when published, or a compressed bomb); its
        rows are checked as they are taken (`checking`)."""
        key, limit = rec["location"], min(rec["max_bytes"], self.max_batch_bytes)
        try:
            data = self.store.get_range(key, 0, limit + 1)
        except NoSuchKey:
            raise BatchRefused(f"the batch artifact {key} does not exist") from None
        if len(data) > limit:
            whose = (
                "the dataset's max_bytes"
                if limit == rec["max_bytes"]
                else "the platform's TRACE_SINK_MAX_BATCH_BYTES"
            )
            raise BatchRefused(f"the batch is over {limit} bytes ({whose})")
        rows = parse(data, rec["content_type"], rec["max_rows"], self.max_batch_bytes)
        return checking(rows, rec["columns"], list(rec["unique_key"]))

    def _upsert(
        self, rec: dict[str, Any], names: list[str], values: Iterator[list[Any]]
    ) -> tuple[int, list[list[Any]]]:
        """One data transaction: the rows, under the record's org and id (never the rows').
        Returns how many were new, and the rows as loaded (for the landed batch's work)."""
        org, record_id = rec["org_id"], rec["record_id"]
        kept: list[list[Any]] = []

        def rows() -> Iterator[list[Any]]:
            for n, v in enumerate(values):
                if n == 1:
                    faults.point("sink.mid_batch")  # chaos: killed with half a batch sent
                kept.append(v)
                yield [org, *v, record_id]

        conn = self._data()
        with conn.transaction():
            self._ensure_on(conn, rec)
            loaded = sink_sql.upsert(
                conn,
                rec["table_name"],
                list(rec["unique_key"]),
                ["org_id", *names, "record_id"],
                rows(),
            )
        return loaded, kept

    # -- the data connection and tables --------------------------------------------------
    def _data(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.data_dsn, autocommit=True)
        return self._conn

    def _ensure(self, ds: dict[str, Any]) -> None:
        if ds["table_name"] in self._tables:
            return
        conn = self._data()
        with conn.transaction():
            self._ensure_on(conn, ds)

    def _ensure_on(self, conn: psycopg.Connection[Any], ds: dict[str, Any]) -> None:
        if ds["table_name"] not in self._tables:
            sink_sql.ensure_table(conn, ds["table_name"], ds["columns"], list(ds["unique_key"]))
            self._tables.add(ds["table_name"])

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _own_alerts(
    rec: dict[str, Any], names: list[str], rows: Iterator[list[Any]]
) -> Iterator[list[Any]]:
    """The org's alert_events: a row's producer (dag_id, job) is the publishing task's, taken
    from the trusted record as its org is, never from the row. An alert_evaluate job of one
    DAG cannot claim another's alerts (nor squat their unique keys, which would swallow the
    real alerts when they come)."""
    if rec.get("dag_id") is None:
        raise BatchRefused("alert_events rows come only from a DAG's alert_evaluate job")
    dag, job = names.index("dag_id"), names.index("job")

    def owned(v: list[Any]) -> list[Any]:
        v[dag], v[job] = str(rec["dag_id"]), rec["job"]
        return v

    return map(owned, rows)
