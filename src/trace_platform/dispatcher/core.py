"""The Dispatcher: the one face the gateway, the control plane, the CLI and the worker use.

It is the task lifecycle (`lifecycle.py`: claim, fetch, heartbeat, complete, retries, reaper,
cancel) wired to its parts: task intents and outbox wake-ups (`intents.py`), worker-pool slots
and their secrets (`slots.py`), lease checks (`fencing.py`), events and output commits
(`commits.py`) and operator state saved by compare-and-set (`state.py`).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg_pool import ConnectionPool

from trace_platform.config import Settings
from trace_platform.contract import EventsRequest, EventsResponse, LeaseRef, TaskRef, TaskSpec
from trace_platform.dispatcher.buffers import Buffers
from trace_platform.dispatcher.commits import Emitter
from trace_platform.dispatcher.intents import Intents
from trace_platform.dispatcher.lifecycle import Lifecycle
from trace_platform.dispatcher.models import AttemptView, TaskView
from trace_platform.dispatcher.slots import Slots
from trace_platform.errors import NotFound
from trace_platform.store.tasks import StateStore, TaskKey
from trace_platform.store.tasks.postgres import PostgresStore


class Dispatcher(Lifecycle):
    """Over a Postgres pool (the product) or any other `StateStore` (the in-memory twin)."""

    def __init__(self, store: ConnectionPool | StateStore, settings: Settings) -> None:
        if isinstance(store, ConnectionPool):
            store = PostgresStore(store)
        intents = Intents(store, settings)
        super().__init__(
            store,
            settings,
            intents=intents,
            slots=Slots(store, settings, intents),
            emitter=Emitter(store, intents),
        )
        self.buffers = Buffers(store, self.emitter)  # buffered datasets: publishes, the sink's

    @property
    def pool(self) -> ConnectionPool:
        """The Postgres pool under the store (for the loops that run their own SQL): in a
        service, the store's own, whose sessions carry its plan settings (generic plans, no
        sequential scans), so only for statements those suit (the cron loop's: rows by key, and
        the cron rows of the active DAGs, without a LIMIT a generic plan could misjudge)."""
        if not isinstance(self.store, PostgresStore):
            raise TypeError("this dispatcher's state store is not Postgres")
        return self.store.pool

    def create_task(
        self, spec: TaskSpec, conn: Any | None = None, status: str = "queued"
    ) -> TaskRef:
        """Task intent and its wake-up in one transaction (the caller's, if given: a store
        transaction or a Postgres connection)."""
        return self.intents.create_task(spec, conn, status)

    def create_tasks(
        self, specs: list[tuple[TaskSpec, str]], conn: Any | None = None
    ) -> list[TaskRef]:
        """Many (spec, status) intents and their wake-ups in one transaction, one statement
        each for the tasks and the wake-ups."""
        return self.intents.create_tasks(specs, conn)

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
    def get_task(self, task_id: UUID, store: StateStore | None = None) -> TaskView:
        """`store`: another store to read it from (a read replica's), else the Dispatcher's."""
        with (store or self.store).transaction() as tx:
            v = tx.task_view(task_id)
            if v is None:
                raise NotFound(f"task {task_id} does not exist")
            key = TaskKey(task_id=task_id, start_day=v["start_day"])
            attempts = tx.task_attempts(key)
            n_events = tx.task_event_count(key)
        return TaskView(
            **{k: v[k] for k in TaskView.model_fields if k in v},
            attempts=[AttemptView(**a) for a in attempts],
            events=n_events,
        )

    def list_tasks(self, limit: int = 50) -> list[dict[str, Any]]:
        with self.store.transaction() as tx:
            return tx.list_tasks(limit)
