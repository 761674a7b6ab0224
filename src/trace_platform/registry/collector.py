"""The collector: deletes retired locations (files a retry or replay superseded, versions an
admin purged) once nothing can reach them — no commit references them and no live query pinned
them (`query_pins`, see migration 0013); the rules are in db/sql/collector.sql `collectable`.
Runs in the API's background loops (api/background.py), a batch at a time.

It deletes only what the platform made (`layout.platform_made`): files under a dataset
version's own prefix in the row's org, and `dataset_<hex>.v_<hex>` tables, dropped through the
sink's login (`data_dsn`: it owns the dataset schemas and can reach nothing else, never the
state login). Anything else it is asked to retire is logged and left (migration 0025).

It also deletes buffer batches' artifacts once their records are settled (migration 0033): a
loaded batch's after the grace, a dead one's after `dead_retention_seconds` (kept that long
for its user to look at), never while another record of the same artifact is pending; and
only a key below its attempt's own buffer prefix (what the publish accepted)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from trace_platform.dispatcher.buffers import batch_key_refused
from trace_platform.layout import platform_made
from trace_platform.objectstore import ObjectStore, delete_prefix
from trace_platform.store.collector import CollectorStore

log = logging.getLogger("trace.collector")


class Collector:
    def __init__(
        self,
        pool: ConnectionPool,
        store: ObjectStore,
        data_dsn: str,
        *,
        grace_seconds: float,
        batch_size: int,
        dead_retention_seconds: float = 7 * 86400.0,
    ) -> None:
        self.pool = pool
        self.store = store
        self.data_dsn = data_dsn  # the sink's login: where a retired Postgres table lives
        self.grace_seconds = grace_seconds
        self.batch_size = batch_size
        self.dead_retention_seconds = dead_retention_seconds

    def _drop_table(self, location: str) -> bool:
        schema, _, table = location.partition(".")
        try:
            with psycopg.connect(self.data_dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(schema, table))
                )
        except psycopg.errors.DependentObjectsStillExist:
            # e.g. a published view still reads it: it stays retired, retried next run.
            log.warning("retired table %s still has dependents; kept", location)
            return False
        return True

    def _delete(self, row: dict[str, Any]) -> bool:
        if row["backend"] == "postgres":
            # Named by UUIDs only: no quoting can make it reach another schema.
            return self._drop_table(row["location"])
        delete_prefix(self.store, row["location"])
        return True

    def collect_batch(self) -> tuple[int, int]:
        """One batch: deletes what may go and marks it, refuses what is not the platform's;
        returns (how many were deleted, how many rows the batch held)."""
        with self.pool.connection() as conn, conn.transaction():
            store = CollectorStore(conn)
            store.expire_pins()
            rows = store.collectable(grace=self.grace_seconds, batch=self.batch_size).fetchall()
            done = []
            for r in rows:
                if not platform_made(r["backend"], r["location"], r["org_id"]):
                    reason = "not a location the platform made for this org's datasets"
                    log.warning("refused to delete %s %r: %s", r["backend"], r["location"], reason)
                    store.mark_refused(id=r["id"], reason=reason)
                elif self._delete(r):
                    done.append(r["id"])
            if done:
                store.mark_deleted(ids=done)
        return len(done), len(rows)

    def collect_buffer_batch(self) -> tuple[int, int]:
        """One batch of settled buffer batches' artifacts: deleted and marked, or refused when
        the key is not one the attempt could write; returns (deleted, rows the batch held)."""
        with self.pool.connection() as conn, conn.transaction():
            store = CollectorStore(conn)
            rows = store.collectable_batches(
                grace=self.grace_seconds,
                dead_retention=self.dead_retention_seconds,
                batch=self.batch_size,
            ).fetchall()
            done = []
            for r in rows:
                if not _own_batch(r):
                    reason = "not a key below its attempt's own buffer prefix"
                    log.warning("refused to delete batch %r: %s", r["location"], reason)
                    store.mark_batch_refused(record_id=r["record_id"], reason=reason)
                    continue
                self.store.delete(r["location"])  # a missing key is no error
                done.append(r["record_id"])
            if done:
                store.mark_batches_collected(ids=done)
        return len(done), len(rows)

    def collect(self, stop: threading.Event | None = None) -> int:
        """Batches until none is full (or `stop`), retired locations then buffer batches'
        artifacts; returns how many were deleted."""
        total = 0
        for one in (self.collect_batch, self.collect_buffer_batch):
            while stop is None or not stop.is_set():
                n, seen = one()
                total += n
                if seen < self.batch_size:
                    break
        return total


def _own_batch(row: dict[str, Any]) -> bool:
    """Whether a record's artifact is a key the platform let its attempt write (the publish's
    own check, made again: the collector deletes nothing else whatever a row says)."""
    why = batch_key_refused(row["org_id"], row["task_id"], row["attempt"], row["location"])
    return why is None


def run_collector(collector: Collector, stop: threading.Event, interval: float) -> None:
    while not stop.is_set():
        try:
            n = collector.collect(stop)
            if n:
                log.info("collected %d retired locations", n)
        except Exception:  # a bad pass must not end the loop; the next one retries
            log.exception("collector pass failed")
        stop.wait(interval)
