"""The state store's `deliveries` calls (`db/sql/deliveries.sql`): destinations, deliveries
and their attempts."""

from __future__ import annotations

from typing import Any

from psycopg import Cursor

from trace_platform.db.queries import Queries, literal_limit
from trace_platform.store.calls import Calls, Row

_Q = Queries("deliveries")


class DeliveryStore(Calls):
    """Every call takes the query's parameters by name, as `deliveries.sql` spells them."""

    def insert_delivery(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.insert_delivery, p)

    def lease_due(self, *, limit: int, **p: Any) -> Cursor[Row]:
        return self._run(literal_limit(_Q.lease_due, limit), p)

    def destinations_named(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.destinations_named, p)

    def destination(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.destination, p)

    def insert_attempt(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.insert_attempt, p)

    def settle(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.settle, p)

    def retry(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.retry, p)

    def list_deliveries(self, *, limit: int, **p: Any) -> Cursor[Row]:
        return self._run(literal_limit(_Q.list_deliveries, limit), p)

    def delivery(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.delivery, p)

    def attempts(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.attempts, p)

    def insert_destination(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.insert_destination, p)

    def set_destination(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.set_destination, p)

    def list_destinations(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.list_destinations, p)

    def delivery_counts(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.delivery_counts, p)

    def alert_work_open(self, **p: Any) -> Cursor[Row]:
        return self._run(_Q.alert_work_open, p)
