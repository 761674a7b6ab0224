"""The state store's `alerts` calls (`db/sql/alerts.sql`): the platform's org-wide alert
datasets' marks and writers."""

from __future__ import annotations

from uuid import UUID

from psycopg import Cursor

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("alerts")


class AlertStore(Calls):
    def mark_platform(self, *, dataset_uuid: UUID, platform: str) -> Cursor[Row]:
        return self._run(_Q.mark_platform, {"dataset_uuid": dataset_uuid, "platform": platform})

    def set_dag_writers(self, *, dataset_uuid: UUID, dag: str, writers: list[str]) -> Cursor[Row]:
        return self._run(
            _Q.set_dag_writers, {"dataset_uuid": dataset_uuid, "dag": dag, "writers": writers}
        )
