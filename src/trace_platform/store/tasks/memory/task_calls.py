"""A task's intent (its registry and status rows) and the views of tasks, on the in-memory
tables, as `db/sql/dispatcher.sql`'s queries do."""

from __future__ import annotations

from uuid import UUID

from trace_platform.store.tasks.memory.tables import (
    _ATTEMPT,
    _FOR_UPDATE_REGISTRY,
    _STATUS,
    _VIEW_REGISTRY,
    _VIEW_STATUS,
    ConstraintViolation,
    _check_status,
    _json_text,
    _jsonb,
    _limit,
    _not_null,
    _pg_bool,
    _pick,
    _start_day,
)
from trace_platform.store.tasks.memory.tx_base import TxBase
from trace_platform.store.tasks.params import NewTask, TaskKey
from trace_platform.store.tasks.protocol import Row


class TaskCalls(TxBase):
    """Tasks: inserted, viewed and listed."""

    def insert_tasks(self, ps: list[NewTask]) -> list[int]:
        # One statement in Postgres: a duplicate among them leaves none of them.
        if len({p.task_id for p in ps}) < len(ps):
            raise ConstraintViolation("task_status_pkey: a task id given twice")
        return [self._insert_task(p) for p in ps]

    def _insert_task(self, p: NewTask) -> int:
        if p.task_id in self._t.task_status:
            raise ConstraintViolation(f"task_status_pkey: task {p.task_id} already exists")
        start_day = _start_day(self.now)
        registry: Row = {
            "task_id": p.task_id,
            "start_day": start_day,
            "org_id": p.org_id,
            "dag_id": p.dag_id,
            "dag_version": p.dag_version,
            "job": p.job,
            "operator": p.operator,
            "runtime": p.runtime,
            "config": _jsonb(p.config),
            "parent_task_id": p.parent_task_id,
            "input_event_id": p.input_event_id,
            "input_event": _jsonb(p.input_event),
            "input_versions": _jsonb(p.input_versions),
            "timeout_seconds": p.timeout_seconds,
            "max_attempts": p.max_attempts,
            "retry_backoff_seconds": p.retry_backoff_seconds,
            "retry_backoff_max_seconds": p.retry_backoff_max_seconds,
            "created_at": self.now,
            "run_id": p.run_id,
            "worker_pool": p.worker_pool,
            "max_concurrency": p.max_concurrency,
            "outputs": _jsonb(p.outputs),
        }
        _not_null(
            "task_registry",
            registry,
            (
                "task_id",
                "org_id",
                "job",
                "operator",
                "runtime",
                "config",
                "input_versions",
                "timeout_seconds",
                "max_attempts",
                "retry_backoff_seconds",
                "retry_backoff_max_seconds",
                "outputs",
            ),
        )
        if registry["timeout_seconds"] <= 0:
            raise ConstraintViolation("task_registry_timeout_seconds_check")
        if registry["max_attempts"] <= 0:
            raise ConstraintViolation("task_registry_max_attempts_check")
        _check_status(p.status)
        for k in ("retry_backoff_seconds", "retry_backoff_max_seconds"):
            registry[k] = float(registry[k])  # double precision
        status: Row = dict.fromkeys(_STATUS)
        status.update(
            task_id=p.task_id,
            start_day=start_day,
            status=p.status,
            attempt=0,
            next_attempt_at=self.now,
            cancel_requested=False,
            updated_at=self.now,
        )
        status["whole_job"] = p.whole_job if p.worker_pool is not None else None
        self._t.task_registry[p.task_id] = registry
        self._t.task_status[p.task_id] = status
        return start_day

    def status(self, task_id: UUID) -> Row | None:
        s = self._t.task_status.get(task_id)
        return _pick(s, _STATUS) if s is not None else None

    def status_for_update(self, task_id: UUID) -> Row | None:
        s = self._t.task_status.get(task_id)
        r = self._t.task_registry.get(task_id)
        if s is None or r is None or r["start_day"] != s["start_day"]:
            return None
        row = _pick(s, _STATUS) | _pick(r, _FOR_UPDATE_REGISTRY)
        event = r["input_event"]
        invalidates = _json_text(event.get("invalidates")) if isinstance(event, dict) else None
        row["reprocessing"] = _pg_bool(invalidates) if invalidates is not None else False
        # No DAG versions in memory: none was rolled back or abandoned.
        row["version_state"] = None
        row["withdrawn"] = False
        return row

    def task_view(self, task_id: UUID) -> Row | None:
        s = self._t.task_status.get(task_id)
        r = self._t.task_registry.get(task_id)
        if s is None or r is None or r["start_day"] != s["start_day"]:
            return None
        return _pick(r, _VIEW_REGISTRY) | _pick(s, _VIEW_STATUS)

    def task_attempts(self, key: TaskKey) -> list[Row]:
        rows = [
            a
            for a in self._t.task_attempts.values()
            if a["task_id"] == key.task_id and a["start_day"] == key.start_day
        ]
        return [_pick(a, _ATTEMPT) for a in sorted(rows, key=lambda a: a["attempt"])]

    def task_event_count(self, key: TaskKey) -> int:
        return sum(
            1
            for e in self._t.events.values()
            if e["producer_task_id"] == key.task_id and e["start_day"] == key.start_day
        )

    def list_tasks(self, limit: int) -> list[Row]:
        # Ties in created_at (one transaction's tasks) come newest-inserted first.
        joined = list(self._joined())[::-1]
        joined.sort(key=lambda sr: sr[1]["created_at"], reverse=True)
        rows = [
            _pick(r, ("task_id", "job", "operator", "created_at"))
            | _pick(s, ("status", "attempt", "last_error", "finished_at"))
            for s, r in joined
        ]
        return _limit(rows, limit)

    def task_dag_paused(self, task_id: UUID) -> Row | None:
        r = self._t.task_registry.get(task_id)
        dag = self._t.dags.get(r["dag_id"]) if r is not None and r["dag_id"] is not None else None
        return _pick(dag, ("name", "paused")) if dag is not None else None

    def lock_task_dag_shared(self, task_id: UUID) -> None:
        pass  # the store lock already serialises transactions

    def lock_dag_shared(self, dag_id: UUID) -> None:
        pass  # the store lock already serialises transactions
