"""The state store in memory: `PostgresStore`'s twin for lifecycle unit tests without Postgres.

Each `MemoryTx` call does what its named query in `db/sql/dispatcher.sql`, `outbox.sql` or
`reads.sql` does, on plain dict rows: the same columns back, the same filters, ordering and
state changes, SQL NULLs included (a comparison with None is never true), JSONB columns kept
as JSON (stored and read back through `json`, as psycopg does). Like procrastinate's
`InMemoryConnector`, it models the queries, not a database.

A transaction holds the store's one lock (transactions serialise, as row locks would make
them), sees one `now()` (the clock read when it opened) and is undone from a snapshot if its
block raises. So the advisory locks are no-ops and `FOR UPDATE SKIP LOCKED` skips nothing.

Limits: there is no DAG registry (only `add_dag`'s name and paused flag: no versions, jobs,
subscriptions or lineage, so `tasks_for_event` and `foreign_inputs` find nothing, there is no
deployer, nothing is withdrawn and operator state has lineage 0), no users and no secrets vault
(a slot's secrets are all "not set"), and no partitions. It checks what the
lifecycle relies on (keys, NOT NULL, statuses, JSON), not every value Postgres refuses: a
NUL in text, say, is stored. A nested `transaction()` in one thread
works like a savepoint (its rollback undoes only its own writes), whereas `PostgresStore` would
open a second, independent transaction.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from trace_platform.store.tasks.memory.tables import (
    _TABLES,
    ConstraintViolation,
    _jsonb,
    _Tables,
    _utcnow,
)
from trace_platform.store.tasks.memory.tx import MemoryTx
from trace_platform.store.tasks.protocol import Row

__all__ = ["MemoryStore", "MemoryTx"]


class MemoryStore:
    """The state store in memory (see the module docstring); not persisted."""

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self.clock: Callable[[], datetime] = clock or _utcnow
        self._lock = threading.RLock()
        self._tables = _Tables()
        # Like Postgres sequences, ids are never handed out twice: a rollback keeps the gap.
        self._outbox_ids: itertools.count[int] = itertools.count(1)
        self._retired_ids: itertools.count[int] = itertools.count(1)

    def _now(self) -> datetime:
        now = self.clock()
        if now.tzinfo is None:
            raise ValueError("the clock must return timezone-aware datetimes (timestamptz)")
        return now

    @contextmanager
    def transaction(self) -> Iterator[MemoryTx]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        with self._lock:
            snapshot = copy.deepcopy(self._tables)
            try:
                yield MemoryTx(self, self._now())
            except BaseException:
                self._tables = snapshot
                raise

    def statement(self) -> AbstractContextManager[MemoryTx]:
        """A transaction: the twin's calls are atomic one by one as well."""
        return self.transaction()

    def adopt(self, conn: Any) -> MemoryTx:
        if isinstance(conn, MemoryTx):
            return conn
        raise TypeError("the memory store has no Postgres connections")

    def ensure_partitions(self) -> int:
        return 0  # no partitions

    # -- setup for tests: what the DAG registry and the datasets would hold -----------------
    def add_dag(self, dag_id: UUID, name: str, paused: bool = False) -> None:
        with self._lock:
            self._tables.dags[dag_id] = {"dag_id": dag_id, "name": name, "paused": paused}

    def set_paused(self, dag_id: UUID, paused: bool) -> None:
        with self._lock:
            self._tables.dags[dag_id]["paused"] = paused

    def add_pool(
        self,
        dag_id: UUID,
        pool: str,
        size: int,
        env: Mapping[str, Any] | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> None:
        """Slots 0..size-1 of a worker pool, each with this env and these secrets (env var:
        secret name)."""
        with self._lock:
            for i in range(size):
                key = (dag_id, pool, i)
                if key in self._tables.pool_slots:
                    raise ConstraintViolation(f"pool_slots_pkey: slot {i} of {pool} exists")
                self._tables.pool_slots[key] = {
                    "dag_id": dag_id,
                    "pool": pool,
                    "slot_index": i,
                    "env": _jsonb(dict(env or {})),
                    "secrets": _jsonb(dict(secrets or {})),
                    "retired": False,
                    "leased_by_task": None,
                    "leased_job": None,
                    "leased_at": None,
                    "leased_whole": False,
                }

    def retire_slots(self, dag_id: UUID, pool: str, keep: int = 0) -> None:
        """As a deploy whose version lists only `keep` slots of the pool (0: not the pool)."""
        with self._lock:
            for (d, p, i), slot in self._tables.pool_slots.items():
                if d == dag_id and p == pool and i >= keep:
                    slot["retired"] = True

    def add_dataset_version(
        self,
        dataset_uuid: UUID,
        dataset_version: UUID,
        update_strategy: str = "append",
        unique_key: list[str] | None = None,
        *,
        org_id: UUID | None = None,
        backend: str = "parquet",
    ) -> None:
        """A dataset version (its dataset made on first use, with this version's shape)."""
        if update_strategy not in ("replace", "append"):
            raise ConstraintViolation(f"update_strategy check: {update_strategy!r}")
        with self._lock:
            self._tables.datasets.setdefault(
                dataset_uuid,
                {
                    "dataset_uuid": dataset_uuid,
                    "org_id": org_id,
                    "backend": backend,
                    "update_strategy": update_strategy,
                    "unique_key": list(unique_key or []),
                },
            )
            self._tables.dataset_versions[dataset_version] = {
                "dataset_version": dataset_version,
                "dataset_uuid": dataset_uuid,
                "backend": backend,
                "update_strategy": update_strategy,
                "unique_key": list(unique_key) if unique_key is not None else None,
                "state": "complete",
            }

    # -- test harness ---------------------------------------------------------------------
    # Each sets one status column to a second ago, as the Postgres harness's UPDATE does (a
    # task that does not exist is left alone).
    def _backdate(self, task_id: UUID, column: str) -> None:
        with self._lock:
            s = self._tables.task_status.get(task_id)
            if s is not None:
                s[column] = self._now() - timedelta(seconds=1)

    def expire_lease(self, task_id: UUID) -> None:
        """The lease ran out a second ago (missed heartbeats): `expired_leases` finds it."""
        self._backdate(task_id, "lease_until")

    def expire_deadline(self, task_id: UUID) -> None:
        """The attempt's deadline (timeout_seconds) passed a second ago: it timed out."""
        self._backdate(task_id, "deadline_at")

    def make_claimable(self, task_id: UUID) -> None:
        """The task's retry backoff ended a second ago."""
        self._backdate(task_id, "next_attempt_at")

    def flag_cancel(self, task_id: UUID) -> None:
        """The task's cancel asked, whatever its status (as the Postgres harness's UPDATE)."""
        with self._lock:
            s = self._tables.task_status.get(task_id)
            if s is not None:
                s["cancel_requested"] = True

    def rows(self, table: str) -> list[Row]:
        """A copy of one table's rows (`task_status`, `outbox`, `retired_locations`, ...)."""
        if table not in _TABLES:
            raise KeyError(f"no table {table!r} in the memory store")
        with self._lock:
            stored: Any = getattr(self._tables, table)
            values = stored.values() if isinstance(stored, dict) else stored
            return [copy.deepcopy(r) for r in values]
