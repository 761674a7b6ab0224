"""The state-store conformance suite on the in-memory twin: the task lifecycle without
Postgres (the same tests the Postgres store passes)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest

from tests.support.store_conformance import StateStoreConformance
from trace_platform.config import Settings
from trace_platform.contract import LITE_ORG_ID
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.store.tasks.memory import MemoryStore


class MemoryHarness:
    def __init__(self, settings: Settings) -> None:
        self.store = MemoryStore()
        self.dispatcher = Dispatcher(self.store, settings)

    def expire_lease(self, task_id: UUID) -> None:
        self.store.expire_lease(task_id)

    def expire_deadline(self, task_id: UUID) -> None:
        self.store.expire_deadline(task_id)

    def make_claimable(self, task_id: UUID) -> None:
        self.store.make_claimable(task_id)

    def flag_cancel(self, task_id: UUID) -> None:
        self.store.flag_cancel(task_id)

    def add_dag(self, name: str) -> UUID:
        dag_id = uuid.uuid4()
        self.store.add_dag(dag_id, name)
        return dag_id

    def set_paused(self, dag_id: UUID, paused: bool) -> None:
        self.store.set_paused(dag_id, paused)

    def add_pool(self, dag_id: UUID, pool: str, size: int) -> None:
        self.store.add_pool(dag_id, pool, size)

    def retire_slots(self, dag_id: UUID, pool: str, keep: int) -> None:
        self.store.retire_slots(dag_id, pool, keep)

    def add_dataset_version(
        self, dag_id: UUID, update_strategy: str, unique_key: list[str] | None = None
    ) -> tuple[UUID, UUID]:
        ds, version = uuid.uuid4(), uuid.uuid4()
        self.store.add_dataset_version(ds, version, update_strategy, unique_key, org_id=LITE_ORG_ID)
        return ds, version

    def retired_locations(self) -> list[str]:
        return [r["location"] for r in self.store.rows("retired_locations")]


class TestMemoryStore(StateStoreConformance):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> MemoryHarness:
        settings = Settings(
            state_dsn="postgresql://unused/never",  # the memory store opens no connection
            auth="permissive",
            home=tmp_path / "home",
            lease_seconds=2.0,
            heartbeat_seconds=0.3,
            retry_backoff_seconds=0.05,
            retry_backoff_max_seconds=0.2,
        )
        return MemoryHarness(settings)

    @pytest.mark.xfail(strict=True, reason="the twin does not refuse NUL in text (Postgres does)")
    def test_text_with_a_nul_is_refused(self, d: Dispatcher) -> None:
        super().test_text_with_a_nul_is_refused(d)


def test_a_fake_clock_drives_leases_without_waiting(tmp_path: Path) -> None:
    """The twin's clock is injectable: a lease runs out when the clock says so."""
    from trace_platform.contract import ClaimRequest, TaskSpec

    now = [MemoryStore().clock()]
    store = MemoryStore(clock=lambda: now[0])
    d = Dispatcher(
        store, Settings(state_dsn="postgresql://unused/never", home=tmp_path, lease_seconds=30)
    )
    ref = d.create_task(TaskSpec(job="j", operator="noop", org_id=LITE_ORG_ID))
    d.claim(ClaimRequest(task_id=ref.task_id, worker_id="w"))
    now[0] += timedelta(seconds=29)
    assert d.reap() == 0
    now[0] += timedelta(seconds=2)
    assert d.reap() == 1
    assert d.get_task(ref.task_id).attempts[0].outcome == "lease_expired"
