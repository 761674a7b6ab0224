"""Task intents and their wake-ups: a task row and the outbox row that wakes it are written in
one transaction (never a direct enqueue); the outbox publisher sends the wake-up later."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from trace_platform.config import Settings
from trace_platform.contract import MAX_CONFIG_BYTES, TaskRef, TaskSpec
from trace_platform.db.queries import Queries
from trace_platform.errors import Invalid
from trace_platform.queue import payloads

_Q = Queries("dispatcher")


class Intents:
    def __init__(self, pool: ConnectionPool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings

    def wake(self, conn: Connection[Any], task_id: UUID, delay: float = 0) -> None:
        """An outbox row in the caller's transaction: the task's wake-up, after `delay`."""
        payload = payloads.encode(payloads.TaskWakeup(task_id=task_id))
        conn.execute(
            _Q.insert_outbox,
            {
                "queue": self.settings.task_queue,
                "payload": Jsonb(payload, dumps=lambda s: s),
                "delay": math.ceil(delay),
            },
        )

    def create_task(
        self, spec: TaskSpec, conn: Connection[Any] | None = None, status: str = "queued"
    ) -> TaskRef:
        """Task intent and its wake-up in one transaction (the caller's, if given). A
        'buffered' task gets no wake-up: it waits for its DAG version's cutover."""
        if len(json.dumps(spec.config, default=str)) > MAX_CONFIG_BYTES:
            raise Invalid(f"task config is larger than {MAX_CONFIG_BYTES} bytes")
        task_id = uuid.uuid4()
        params = self._registry_row(task_id, spec)

        def write(c: Connection[Any]) -> TaskRef:
            row = c.execute(_Q.insert_registry, params).fetchone()
            assert row is not None
            start_day = row["start_day"]
            c.execute(
                _Q.insert_status, {"task_id": task_id, "start_day": start_day, "status": status}
            )
            if status == "queued":
                self.wake(c, task_id)
            return TaskRef(task_id=task_id, start_day=start_day, status=status)  # type: ignore[arg-type]

        if conn is not None:
            return write(conn)
        with self.pool.connection() as c, c.transaction():
            return write(c)

    def _registry_row(self, task_id: UUID, spec: TaskSpec) -> dict[str, Any]:
        """The spec with the settings' defaults filled in, as `insert_registry` takes it."""
        s = self.settings
        return {
            "task_id": task_id,
            "org_id": spec.org_id,
            "dag_id": spec.dag_id,
            "dag_version": spec.dag_version,
            "job": spec.job,
            "operator": spec.operator,
            "runtime": spec.runtime,
            "config": Jsonb(spec.config),
            "parent_task_id": spec.parent_task_id,
            "input_event_id": spec.input_event_id,
            "input_event": Jsonb(spec.input_event) if spec.input_event is not None else None,
            "input_versions": Jsonb([r.model_dump(mode="json") for r in spec.input_versions]),
            "outputs": Jsonb([r.model_dump(mode="json") for r in spec.outputs]),
            "run_id": spec.run_id,
            "worker_pool": spec.worker_pool,
            "max_concurrency": spec.max_concurrency,
            "timeout_seconds": spec.timeout_seconds or s.default_timeout_seconds,
            "max_attempts": spec.max_attempts or s.default_max_attempts,
            "retry_backoff_seconds": (
                spec.retry_backoff_seconds
                if spec.retry_backoff_seconds is not None
                else s.retry_backoff_seconds
            ),
            "retry_backoff_max_seconds": (
                spec.retry_backoff_max_seconds
                if spec.retry_backoff_max_seconds is not None
                else s.retry_backoff_max_seconds
            ),
        }

    def rewake(self, after_seconds: float, limit: int = 500) -> int:
        """Anti-entropy: a fresh wake-up for queued tasks left untouched for `after_seconds`."""
        with self.pool.connection() as conn, conn.transaction():
            rows = conn.execute(
                _Q.stranded_queued, {"after": after_seconds, "limit": limit}
            ).fetchall()
            for r in rows:
                self.wake(conn, r["task_id"])
            if rows:
                conn.execute(_Q.touch, {"ids": [r["task_id"] for r in rows]})
        return len(rows)
