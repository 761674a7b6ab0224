"""The state-store conformance suite on the Postgres store (a fresh database per test)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import psycopg
import pytest

from tests.support.store_conformance import (
    StateStoreConformance,
    claim,
    complete,
    one_held_two_waiting,
    spec,
    woken,
)
from trace_platform.contract import LITE_ORG_ID
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.slots import Slots
from trace_platform.errors import Conflict
from trace_platform.services import Services
from trace_platform.store.tasks.postgres import PostgresStore


class PostgresHarness:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.dispatcher: Dispatcher = services.dispatcher

    def _run(self, sql: str, *args: Any) -> None:
        with self.services.pool.connection() as conn:
            conn.execute(sql, args)

    def expire_lease(self, task_id: UUID) -> None:
        self._run(
            "UPDATE task_status SET lease_until = now() - interval '1 s' WHERE task_id = %s",
            task_id,
        )

    def expire_deadline(self, task_id: UUID) -> None:
        self._run(
            "UPDATE task_status SET deadline_at = now() - interval '1 s' WHERE task_id = %s",
            task_id,
        )

    def make_claimable(self, task_id: UUID) -> None:
        self._run(
            "UPDATE task_status SET next_attempt_at = now() - interval '1 s' WHERE task_id = %s",
            task_id,
        )

    def flag_cancel(self, task_id: UUID) -> None:
        self._run("UPDATE task_status SET cancel_requested = true WHERE task_id = %s", task_id)

    def add_dag(self, name: str) -> UUID:
        dag_id = uuid.uuid4()
        self._run(
            "INSERT INTO dags (dag_id, org_id, name, owner_user_id) "
            "SELECT %s, %s, %s, user_id FROM users WHERE org_id = %s LIMIT 1",
            dag_id,
            LITE_ORG_ID,
            name,
            LITE_ORG_ID,
        )
        return dag_id

    def set_paused(self, dag_id: UUID, paused: bool) -> None:
        self._run("UPDATE dags SET paused = %s WHERE dag_id = %s", paused, dag_id)

    def add_pool(self, dag_id: UUID, pool: str, size: int) -> None:
        self._run(
            "INSERT INTO pool_slots (dag_id, pool, slot_index) "
            "SELECT %s, %s, i FROM generate_series(0, %s - 1) AS i",
            dag_id,
            pool,
            size,
        )

    def retire_slots(self, dag_id: UUID, pool: str, keep: int) -> None:
        self._run(
            "UPDATE pool_slots SET retired = true "
            "WHERE dag_id = %s AND pool = %s AND slot_index >= %s",
            dag_id,
            pool,
            keep,
        )

    def add_dataset_version(
        self, dag_id: UUID, update_strategy: str, unique_key: list[str] | None = None
    ) -> tuple[UUID, UUID]:
        ds, version = uuid.uuid4(), uuid.uuid4()
        self._run(
            "INSERT INTO datasets (dataset_uuid, org_id, dataset_name, backend, location, "
            "update_strategy, producer_dag_id, producer_job, producer_output_index, unique_key) "
            "VALUES (%s, %s, %s, 'parquet', 'mem://d', %s, %s, 'j', "
            "(SELECT count(*) FROM datasets WHERE producer_dag_id = %s), %s)",
            ds,
            LITE_ORG_ID,
            f"d_{ds.hex[:8]}",
            update_strategy,
            dag_id,
            dag_id,
            list(unique_key or []),
        )
        self._run(
            "INSERT INTO dataset_versions (dataset_version, dataset_uuid, dag_id, dag_version, "
            "location, update_strategy, unique_key) VALUES (%s, %s, %s, 1, 'mem://d/v', %s, %s)",
            version,
            ds,
            dag_id,
            update_strategy,
            unique_key,
        )
        return ds, version

    def retired_locations(self) -> list[str]:
        with self.services.pool.connection() as conn:
            rows = conn.execute("SELECT location FROM retired_locations ORDER BY id").fetchall()
        return [r["location"] for r in rows]


class TestPostgresStore(StateStoreConformance):
    @pytest.fixture
    def harness(self, services: Services) -> Iterator[PostgresHarness]:
        yield PostgresHarness(services)


def test_two_claims_of_a_whole_writer_in_two_pools_never_both_find_it_idle(
    services: Services,
) -> None:
    """Each claim locks its own pool: without one more lock per job, a claim in pool `b` could
    read the job idle while a claim in pool `a` had leased its slot, uncommitted. Here that
    other claim is a transaction holding the job's lock while it leases `a`'s slot: the claim
    in `b` waits for it, then sees the lease and refuses."""
    harness = PostgresHarness(services)
    d = services.dispatcher
    dag = harness.add_dag("race")
    harness.add_pool(dag, "a", 1)
    harness.add_pool(dag, "b", 1)
    whole = {"dag_id": dag, "dag_version": 1, "job": "w", "operator": "sql_transform"}
    old = d.create_task(spec(**whole, worker_pool="a")).task_id
    new = d.create_task(spec(**whole, worker_pool="b")).task_id
    outcome: list[object] = []
    with services.pool.connection() as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s::text || '/' || 'whole:w'))", [dag])
        conn.execute(
            "UPDATE pool_slots SET leased_by_task = %s, leased_job = 'w', leased_at = now(), "
            "leased_whole = true "
            "WHERE dag_id = %s AND pool = 'a'",
            [old, dag],
        )

        def claim_new() -> None:
            try:
                outcome.append(claim(d, new))
            except Conflict as e:
                outcome.append(e)

        thread = threading.Thread(target=claim_new)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and not outcome  # waits for the job's lock
    thread.join(10)
    (got,) = outcome
    assert isinstance(got, Conflict) and "runs one at a time" in str(got)


def test_a_statement_commits_as_it_runs_and_its_connection_goes_back_in_a_transaction(
    services: Services,
) -> None:
    """`statement()`: each call its own transaction (no BEGIN/COMMIT round trips), seen by
    another session before the block ends; the connection goes back to the pool as the pool
    hands them out (not in autocommit), also after a statement that failed."""
    store = services.dispatcher.store
    assert isinstance(store, PostgresStore) and store.planned
    task_id = services.dispatcher.create_task(spec()).task_id
    with store.statement() as tx:
        tx.touch([task_id])
        with services.pool.connection() as other:
            seen = other.execute(
                "SELECT updated_at > created_at AS touched FROM task_status "
                "JOIN task_registry USING (task_id, start_day) WHERE task_id = %s",
                [task_id],
            ).fetchone()
        assert seen == {"touched": True}
        conn = tx.conn
    assert conn.autocommit is False
    with pytest.raises(psycopg.errors.DivisionByZero), store.statement() as tx:
        tx.conn.execute("SELECT 1 / 0")
    assert tx.conn.autocommit is False


def test_a_cancel_racing_the_release_that_woke_its_task_still_passes_the_slot_on(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release woke t2 and has not committed when t2 is canceled in another request: the
    cancel waits for the pool's lock, then finds the slot free and wakes t3 (before: it read
    the slot still held, woke nobody, and the slot idled until the rewake)."""
    d = services.dispatcher
    held, t2, t3 = one_held_two_waiting(d, PostgresHarness(services), "race_cancel")
    release = Slots.release
    cancel = threading.Thread(target=lambda: d.cancel(t2))

    def release_then_cancel(self: Slots, tx: Any, task_id: UUID) -> None:
        release(self, tx, task_id)  # t2 woken, uncommitted
        cancel.start()
        cancel.join(1.0)  # it waits for this commit now; it did not before

    monkeypatch.setattr(Slots, "release", release_then_cancel)
    complete(d, held)
    cancel.join(10)
    assert d.get_task(t2).status == "canceled"
    assert [t for t, _ in woken(d)] == [t2, t3]
