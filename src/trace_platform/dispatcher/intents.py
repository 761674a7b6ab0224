"""Task intents and their wake-ups: a task row and the outbox row that wakes it are written in
one transaction (never a direct enqueue); the outbox publisher sends the wake-up later."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any
from uuid import UUID

from trace_platform.config import Settings
from trace_platform.contract import MAX_BACKOFF_SECONDS, MAX_CONFIG_BYTES, TaskRef, TaskSpec
from trace_platform.errors import Invalid
from trace_platform.operators import WHOLE_OUTPUT_OPERATORS
from trace_platform.queue import payloads
from trace_platform.store.tasks import NewTask, StateStore, StoreTx, Wakeup


def _wakeup(task_id: UUID) -> str:
    return payloads.encode(payloads.TaskWakeup(task_id=task_id))


class Intents:
    def __init__(self, store: StateStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    def queue_for(self, runtime: str) -> str:
        """The queue a task of `runtime` is woken on: a lambda task's only the Lambda invoker
        takes (docs/lambda.md), so no platform worker ever claims one."""
        return self.settings.lambda_queue if runtime == "lambda" else self.settings.task_queue

    def wake(self, tx: StoreTx | Any, task_id: UUID, delay: float = 0) -> None:
        """An outbox row in the caller's transaction: the task's wake-up, after `delay`, on its
        runtime's queue. (`tx` may be a connection a caller outside the dispatcher holds.)"""
        payload = _wakeup(task_id)
        # Never past what a spec may ask for (settings are not bounded): the column is an INT.
        seconds = min(math.ceil(delay), MAX_BACKOFF_SECONDS)
        self.store.adopt(tx).insert_task_wakeup(
            task_id,
            Wakeup(queue=self.settings.task_queue, payload=payload, delay=seconds),
            {"lambda": self.settings.lambda_queue},
        )

    def wake_many(self, tx: StoreTx, tasks: list[tuple[UUID, str]]) -> None:
        """Wake-ups now for `tasks` ((task id, its runtime) each, woken on its runtime's queue)
        in the caller's transaction: one outbox statement, whatever their number."""
        tx.insert_outbox_many(
            [
                Wakeup(queue=self.queue_for(runtime), payload=_wakeup(task_id), delay=0)
                for task_id, runtime in tasks
            ]
        )

    def create_task(
        self, spec: TaskSpec, tx: StoreTx | Any | None = None, status: str = "queued"
    ) -> TaskRef:
        """Task intent and its wake-up in one transaction (the caller's, if given). A
        'buffered' task gets no wake-up: it waits for its DAG version's cutover."""
        return self.create_tasks([(spec, status)], tx)[0]

    def create_tasks(
        self, specs: list[tuple[TaskSpec, str]], tx: StoreTx | Any | None = None
    ) -> list[TaskRef]:
        """`create_task` for many (spec, status) pairs in one transaction (the caller's, if
        given), written with one statement for the tasks and one for their wake-ups, whatever
        their number: a run's jobs, an event's fan-out."""
        for spec, _ in specs:
            if len(json.dumps(spec.config, default=str)) > MAX_CONFIG_BYTES:
                raise Invalid(f"task config is larger than {MAX_CONFIG_BYTES} bytes")
        tasks = [self._new_task(uuid.uuid4(), spec, status) for spec, status in specs]

        def write(t: StoreTx) -> list[TaskRef]:
            days = t.insert_tasks(tasks)
            self.wake_many(t, [(n.task_id, n.runtime) for n in tasks if n.status == "queued"])
            return [
                TaskRef(task_id=task.task_id, start_day=day, status=task.status)  # type: ignore[arg-type]
                for task, day in zip(tasks, days, strict=True)
            ]

        if tx is not None:
            return write(self.store.adopt(tx))
        with self.store.transaction() as t:
            return write(t)

    def _new_task(self, task_id: UUID, spec: TaskSpec, status: str) -> NewTask:
        """The spec with the settings' defaults filled in."""
        s = self.settings
        return NewTask(
            task_id=task_id,
            org_id=spec.org_id,
            dag_id=spec.dag_id,
            dag_version=spec.dag_version,
            job=spec.job,
            operator=spec.operator,
            runtime=spec.runtime,
            config=spec.config,
            parent_task_id=spec.parent_task_id,
            input_event_id=spec.input_event_id,
            input_event=spec.input_event,
            input_versions=[r.model_dump(mode="json") for r in spec.input_versions],
            outputs=[r.model_dump(mode="json") for r in spec.outputs],
            run_id=spec.run_id,
            worker_pool=spec.worker_pool,
            max_concurrency=spec.max_concurrency,
            timeout_seconds=spec.timeout_seconds or s.default_timeout_seconds,
            max_attempts=spec.max_attempts or s.default_max_attempts,
            retry_backoff_seconds=(
                spec.retry_backoff_seconds
                if spec.retry_backoff_seconds is not None
                else s.retry_backoff_seconds
            ),
            retry_backoff_max_seconds=(
                spec.retry_backoff_max_seconds
                if spec.retry_backoff_max_seconds is not None
                else s.retry_backoff_max_seconds
            ),
            status=status,
            whole_job=spec.job if spec.operator in WHOLE_OUTPUT_OPERATORS else None,
        )

    def rewake(self, after_seconds: float, limit: int = 500) -> int:
        """Anti-entropy: a fresh wake-up for queued tasks left untouched for `after_seconds`."""
        with self.store.transaction() as tx:
            rows = tx.stranded_queued(after_seconds, limit)
            for r in rows:
                self.wake(tx, r["task_id"])
            if rows:
                tx.touch([r["task_id"] for r in rows])
        return len(rows)
