"""The state store's `metrics` calls (`db/sql/metrics.sql`): what a /metrics scrape reads."""

from __future__ import annotations

from psycopg import Cursor

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("metrics")


class MetricsStore(Calls):
    def live_tasks(self) -> Cursor[Row]:
        return self._run(_Q.live_tasks)

    def status_statistics(self) -> Cursor[Row]:
        return self._run(_Q.status_statistics)

    def pgqueue_messages(self) -> Cursor[Row]:
        return self._run(_Q.pgqueue_messages)

    def pgqueue_leased_batches(self) -> Cursor[Row]:
        return self._run(_Q.pgqueue_leased_batches)

    def pgqueue_dead(self) -> Cursor[Row]:
        return self._run(_Q.pgqueue_dead)

    def outbox_lag(self) -> Cursor[Row]:
        return self._run(_Q.outbox_lag)

    def delivery_backlog(self) -> Cursor[Row]:
        return self._run(_Q.delivery_backlog)

    def sink_backlog(self) -> Cursor[Row]:
        return self._run(_Q.sink_backlog)

    def worker_registry(self) -> Cursor[Row]:
        return self._run(_Q.worker_registry)

    def bound(self, milliseconds: int) -> None:
        """Every later statement of the caller's transaction ends after `milliseconds`."""
        self._run("SELECT set_config('statement_timeout', %(ms)s, true)", {"ms": str(milliseconds)})
