"""What every call of a `MemoryTx` shares: its store's tables, its `now()`, and the joins and
lookups more than one named query makes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING
from uuid import UUID

from trace_platform.store.tasks.memory.tables import _Tables
from trace_platform.store.tasks.protocol import Row

if TYPE_CHECKING:
    from trace_platform.store.tasks.memory import MemoryStore


class TxBase:
    """One transaction on the store's tables: the store, and `now()` for every call."""

    def __init__(self, store: MemoryStore, now: datetime) -> None:
        self.store = store
        self.now = now  # Postgres's now(): the transaction's start, the same for every call

    @property
    def _t(self) -> _Tables:
        # Looked up on each call: a nested transaction's rollback swaps the store's tables.
        return self.store._tables

    def _joined(self) -> Iterator[tuple[Row, Row]]:
        """task_status JOIN task_registry ON task_id and start_day."""
        for s in self._t.task_status.values():
            r = self._t.task_registry.get(s["task_id"])
            if r is not None and r["start_day"] == s["start_day"]:
                yield s, r

    def _dag_paused(self, dag_id: UUID | None) -> bool:
        """EXISTS (SELECT 1 FROM dags d WHERE d.dag_id = r.dag_id AND d.paused)."""
        dag = self._t.dags.get(dag_id) if dag_id is not None else None
        return dag is not None and bool(dag["paused"])

    def _slot_of(self, task_id: UUID) -> Row | None:
        for slot in self._t.pool_slots.values():
            if slot["leased_by_task"] == task_id:
                return slot
        return None
