"""The state store's `tasks` calls (`db/sql/tasks.sql`)."""

from __future__ import annotations

from uuid import UUID

from psycopg import Cursor

from trace_platform.db.queries import Queries, literal_limit
from trace_platform.store.calls import Calls, Row

_Q = Queries("tasks")


class TaskViewStore(Calls):
    """The calls of `db/sql/tasks.sql`, each with its parameters by name and type, on the
    caller's connection (inside the caller's transaction); each returns its cursor."""

    def task_scope(self, *, task_id: UUID) -> Cursor[Row]:
        """What decides who may see a task: its org and, for a DAG task, its DAG's owner and roles."""
        return self._run(_Q.task_scope, {"task_id": task_id})

    def org_tasks(self, *, org_id: UUID, limit: int) -> Cursor[Row]:
        return self._run(literal_limit(_Q.org_tasks, limit), {"org_id": org_id})

    def foreign_datasets(self, *, uuids: list[UUID], org_id: UUID) -> Cursor[Row]:
        """Of these dataset uuids, the ones another org owns (an ad-hoc task may not name them)."""
        return self._run(_Q.foreign_datasets, {"uuids": uuids, "org_id": org_id})
