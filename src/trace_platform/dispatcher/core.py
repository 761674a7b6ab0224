"""The Dispatcher: the one face the gateway, the control plane, the CLI and the worker use.

It is the task lifecycle (`lifecycle.py`: claim, fetch, heartbeat, complete, retries, reaper,
cancel) wired to its parts: task intents and outbox wake-ups (`intents.py`), worker-pool slots
and their secrets (`slots.py`), lease checks (`fencing.py`), events and output commits
(`commits.py`) and operator state saved by compare-and-set (`state.py`).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg_pool import ConnectionPool

from trace_platform.config import Settings
from trace_platform.contract import EventsRequest, EventsResponse, LeaseRef, TaskRef, TaskSpec
from trace_platform.db.queries import Queries
from trace_platform.dispatcher.commits import Emitter
from trace_platform.dispatcher.intents import Intents
from trace_platform.dispatcher.lifecycle import Lifecycle
from trace_platform.dispatcher.models import AttemptView, TaskView
from trace_platform.dispatcher.slots import Slots
from trace_platform.errors import NotFound

_Q = Queries("dispatcher")


class Dispatcher(Lifecycle):
    def __init__(self, pool: ConnectionPool, settings: Settings) -> None:
        intents = Intents(pool, settings)
        super().__init__(
            pool,
            settings,
            intents=intents,
            slots=Slots(pool, settings, intents),
            emitter=Emitter(pool, intents),
        )

    def create_task(
        self, spec: TaskSpec, conn: Connection[Any] | None = None, status: str = "queued"
    ) -> TaskRef:
        """Task intent and its wake-up in one transaction (the caller's, if given)."""
        return self.intents.create_task(spec, conn, status)

    def rewake(self, after_seconds: float, limit: int = 500) -> int:
        """Anti-entropy: a fresh wake-up for queued tasks left untouched for `after_seconds`."""
        return self.intents.rewake(after_seconds, limit)

    def secrets(self, ref: LeaseRef) -> dict[str, str]:
        """The secret env of the task's slot, for the wrapper only (never logged)."""
        return self.slots.secrets(ref)

    def events(self, req: EventsRequest) -> EventsResponse:
        """Events reported while the attempt runs; each new one creates the tasks it starts."""
        return self.emitter.emit(req)

    # -- user-facing views ---------------------------------------------------------------
    def get_task(self, task_id: UUID) -> TaskView:
        with self.pool.connection() as conn:
            v = conn.execute(_Q.task_view, {"task_id": task_id}).fetchone()
            if v is None:
                raise NotFound(f"task {task_id} does not exist")
            key = {"task_id": task_id, "start_day": v["start_day"]}
            attempts = conn.execute(_Q.task_attempts, key).fetchall()
            n_events = conn.execute(_Q.task_event_count, key).fetchone()
        return TaskView(
            **{k: v[k] for k in TaskView.model_fields if k in v},
            attempts=[AttemptView(**a) for a in attempts],
            events=n_events["n"] if n_events else 0,
        )

    def list_tasks(self, limit: int = 50) -> list[dict[str, Any]]:
        with self.pool.connection() as conn:
            return conn.execute(_Q.list_tasks, {"limit": limit}).fetchall()
