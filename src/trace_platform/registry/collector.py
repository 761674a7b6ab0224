"""The collector: deletes retired locations (files a retry or replay superseded, versions an
admin purged) once nothing can reach them — no commit references them and no live query pinned
them (`query_pins`, see migration 0013); the rules are in db/sql/collector.sql `collectable`.
Runs in the API's background loops (api/background.py), a batch at a time.

It deletes only what the platform made (`layout.platform_made`): files under a dataset
version's own prefix in the row's org, and `dataset_<hex>.v_<hex>` tables, dropped through the
sink's login (`data_dsn`: it owns the dataset schemas and can reach nothing else, never the
state login). Anything else it is asked to retire is logged and left (migration 0025)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

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
    ) -> None:
        self.pool = pool
        self.store = store
        self.data_dsn = data_dsn  # the sink's login: where a retired Postgres table lives
        self.grace_seconds = grace_seconds
        self.batch_size = batch_size

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

    def collect(self, stop: threading.Event | None = None) -> int:
        """Batches until none is full (or `stop`); returns how many locations were deleted."""
        total = 0
        while stop is None or not stop.is_set():
            n, seen = self.collect_batch()
            total += n
            if seen < self.batch_size:
                break
        return total


def run_collector(collector: Collector, stop: threading.Event, interval: float) -> None:
    while not stop.is_set():
        try:
            n = collector.collect(stop)
            if n:
                log.info("collected %d retired locations", n)
        except Exception:  # a bad pass must not end the loop; the next one retries
            log.exception("collector pass failed")
        stop.wait(interval)
