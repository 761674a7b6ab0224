"""The state store's `workers` calls (`db/sql/workers.sql`): the worker registry."""

from __future__ import annotations

from typing import Any

from psycopg import Cursor

from trace_platform.db.queries import Queries, literal_limit
from trace_platform.store.calls import Calls, Row

_Q = Queries("workers")


class WorkerStore(Calls):
    """Every call takes the query's parameters by name, as `workers.sql` spells them."""

    def register(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.register, p)

    def beat(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.beat, p)

    def stop(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.stop, p)

    def worker(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.worker, p)

    def mark_dead(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.mark_dead, p)

    def prune(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.prune, p)

    def list_workers(self, *, limit: int, **p: Any) -> Cursor[Row]:
        return self._run(literal_limit(_Q.list_workers, limit), p)
