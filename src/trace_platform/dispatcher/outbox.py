"""The outbox publisher: pending outbox rows -> QueueDriver.publish -> marked sent.

Publishing and marking happen after the intent committed, in the publisher's own transaction.
Killed between the two, the rows stay unsent and are published again: a duplicate wake-up,
never a lost one. Several publishers may run at once: SKIP LOCKED splits the rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from trace_platform import faults
from trace_platform.queue.driver import QueueDriver
from trace_platform.store.tasks import StateStore
from trace_platform.store.tasks.postgres import PostgresStore

log = logging.getLogger(__name__)


class OutboxPublisher:
    def __init__(
        self,
        store: ConnectionPool | StateStore,
        driver: QueueDriver,
        *,
        batch_size: int = 500,
        purge_after_seconds: float = 3600,
    ) -> None:
        self.store = PostgresStore(store) if isinstance(store, ConnectionPool) else store
        self.driver = driver
        self.batch_size = batch_size
        self.purge_after_seconds = purge_after_seconds

    def publish_once(self) -> int:
        """Publishes one batch; returns how many rows were sent."""
        with self.store.transaction() as tx:
            rows = tx.claim_pending(self.batch_size)
            if not rows:
                return 0
            groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
            for r in rows:
                groups[(r["queue_name"], r["delay_seconds"])].append(r)
            sent: list[int] = []
            for (queue, delay), group in groups.items():
                try:
                    self.driver.publish_many(queue, [r["payload"] for r in group], delay)
                except Exception as e:  # the queue is down or refused: keep rows, retry later
                    log.warning("outbox publish to %s failed: %s", queue, e)
                    tx.mark_failed([r["id"] for r in group], str(e)[:2000])
                    continue
                sent.extend(r["id"] for r in group)
            faults.point("outbox.after_publish")
            if sent:
                tx.mark_sent(sent)
        return len(sent)

    def drain(self) -> int:
        total = 0
        while n := self.publish_once():
            total += n
        return total

    def pending(self) -> int:
        with self.store.transaction() as tx:
            return tx.pending_count()

    def purge_sent(self) -> int:
        with self.store.transaction() as tx:
            return tx.purge_sent(self.purge_after_seconds)

    def run(self, stop: threading.Event, dsn: str, poll_seconds: float = 1.0) -> None:
        """Publish until `stop`; sleeps on LISTEN trace_outbox between batches, polls as a
        fallback, and reconnects after any failure."""
        listen: psycopg.Connection[Any] | None = None
        last_purge = time.monotonic()
        try:
            while not stop.is_set():
                try:
                    if listen is None or listen.closed:
                        listen = psycopg.connect(dsn, autocommit=True)
                        listen.execute("LISTEN trace_outbox")
                    if self.publish_once() >= self.batch_size:
                        continue
                    if time.monotonic() - last_purge > 60:
                        self.purge_sent()
                        last_purge = time.monotonic()
                    for _ in listen.notifies(timeout=poll_seconds, stop_after=1):
                        pass
                except Exception as e:  # keep publishing after any transient failure
                    log.warning("outbox publisher: %s", e)
                    if listen is not None:
                        listen.close()
                    listen = None
                    stop.wait(poll_seconds)
        finally:
            if listen is not None:
                listen.close()
