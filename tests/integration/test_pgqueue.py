"""pgqueue passes the QueueDriver conformance suite, plus checks specific to its tables."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from tests.support.queue_conformance import QueueDriverConformance, wake
from trace_platform.db.pool import GENERIC_PLANS, make_pool
from trace_platform.db.queries import Queries
from trace_platform.queue.driver import QueueDriver
from trace_platform.queue.pgqueue import PgQueue
from trace_platform.services import Services

_RECEIVE_SQL = Queries("queue").receive


class TestPgQueueConformance(QueueDriverConformance):
    @pytest.fixture
    def driver(self, dsn: str) -> Iterator[PgQueue]:
        # The production set-up (autocommit pools, relaxed acks). A long poll interval proves
        # idle consumers are woken by NOTIFY, not by polling.
        drv = PgQueue.from_dsn(dsn, max_attempts=self.max_attempts, poll_seconds=8.0)
        yield drv
        drv.close()

    def raw_publish(self, driver: QueueDriver, queue: str, body: dict[str, Any]) -> None:
        assert isinstance(driver, PgQueue)
        with psycopg.connect(driver.dsn) as conn:
            conn.execute(
                "INSERT INTO queue_messages (queue_name, payload, max_attempts) VALUES (%s, %s, %s)",
                (queue, json.dumps(body), self.max_attempts),
            )


@pytest.fixture
def pgq(dsn: str) -> Iterator[PgQueue]:
    pool = make_pool(dsn, max_size=4)
    drv = PgQueue(pool, dsn, max_attempts=2, poll_seconds=0.2)
    yield drv
    drv.close()
    pool.close()


def test_expired_final_lease_is_dead_lettered(pgq: PgQueue) -> None:
    """A consumer that crashes on the last delivery: the sweep moves the message."""
    pgq.publish("q", wake())
    for _ in range(2):
        assert len(pgq.receive("q", 1, 0.2)) == 1
        time.sleep(0.3)
    time.sleep(1.1)  # past the sweep interval
    assert pgq.receive("q", 1, 30) == []
    dead = pgq.dead_letters("q")
    assert len(dead) == 1 and "visibility timeout" in dead[0]["last_error"]


def test_receipt_holds_id_and_lease_token(pgq: PgQueue, dsn: str) -> None:
    pgq.publish("q", wake())
    msg = pgq.receive("q", 1, 30)[0]
    msg_id, token = msg.receipt.split(":")
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT lease_token FROM queue_messages WHERE id = %s", (int(msg_id),)
        ).fetchone()
    assert row is not None and str(row[0]) == token
    with pytest.raises(ValueError, match="not a pgqueue receipt"):
        pgq.ack("q", "garbage")


def test_only_the_final_lease_sets_final_lease_until(pgq: PgQueue, dsn: str) -> None:
    """Ordinary leases leave final_lease_until (indexed) alone, so they stay HOT updates."""
    pgq.publish("q", wake())

    def final_lease_until() -> Any:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT final_lease_until FROM queue_messages").fetchone()
        assert row is not None
        return row[0]

    first = pgq.receive("q", 1, 30)[0]
    assert final_lease_until() is None
    assert pgq.nack("q", first.receipt, "retry")
    last = pgq.receive("q", 1, 30)[0]  # max_attempts=2: the last allowed delivery
    assert last.delivery_count == 2 and final_lease_until() is not None


def test_extended_final_lease_is_not_dead_lettered(pgq: PgQueue) -> None:
    """The sweep (on final_lease_until) leaves a final lease alone once it is extended."""
    pgq.publish("q", wake())
    first = pgq.receive("q", 1, 0.2)[0]
    time.sleep(0.3)
    last = pgq.receive("q", 1, 0.5)[0]
    assert first.receipt != last.receipt and last.delivery_count == 2
    assert pgq.extend_visibility("q", last.receipt, 30)
    time.sleep(1.2)  # past the original lease and the sweep interval
    assert pgq.receive("q", 1, 30) == []  # runs the sweep
    assert pgq.dead_letters("q") == []
    assert pgq.ack("q", last.receipt)


def test_ack_many_fences_each_receipt(pgq: PgQueue) -> None:
    """One batch shares a lease token; a stale receipt of a redelivered message still fails,
    in a batch with live ones, and malformed receipts are refused before any delete."""
    pgq.publish_many("q", [wake(), wake()])
    stale = pgq.receive("q", 1, 0.2)[0]
    time.sleep(0.3)
    batch = pgq.receive("q", 2, 30)
    assert len(batch) == 2 and len({m.receipt.split(":")[1] for m in batch}) == 1
    fresh = next(m for m in batch if m.payload == stale.payload)
    assert fresh.receipt != stale.receipt
    with pytest.raises(ValueError, match="not a pgqueue receipt"):
        pgq.ack_many("q", [batch[0].receipt, "1:not-a-token"])
    with pytest.raises(ValueError, match="not a pgqueue receipt"):
        pgq.ack_many("q", [f"{batch[0].receipt},{batch[1].receipt}"])
    for bad in (None, "", 7):  # the error names the bad receipt, not the batch
        with pytest.raises(ValueError, match=f"not a pgqueue receipt: {bad!r}$"):
            pgq.ack_many("q", [batch[0].receipt, bad, batch[1].receipt])  # type: ignore[list-item]
    assert pgq.ack_many("q", [stale.receipt, *(m.receipt for m in batch)]) == 2
    assert pgq.receive("q", 10, 30) == []


def settings_of(pool: Any, *names: str) -> dict[str, str]:
    """The session settings a pool's connection has."""
    with pool.connection() as conn:
        return {
            n: conn.execute("SELECT current_setting(%s) AS v", [n]).fetchone()["v"] for n in names
        }


def test_pools_plan_hot_statements_once_and_keep_the_dsns_options(dsn: str) -> None:
    """The queue's pools (durable and relaxed) use generic plans (see db.pool.GENERIC_PLANS),
    the relaxed one still commits without waiting, and settings the DSN itself gives survive.
    (The test cluster's own default is synchronous_commit=off, so only the relaxed pool's is
    checked.)"""
    given = psycopg.conninfo.make_conninfo(dsn, options="-c application_name=from_the_dsn")
    drv = PgQueue.from_dsn(given)
    try:
        for pool in (drv.pool, drv.relaxed):
            assert settings_of(pool, "plan_cache_mode", "application_name") == {
                "plan_cache_mode": "force_generic_plan",
                "application_name": "from_the_dsn",
            }
        assert drv.relaxed is not drv.pool
        with drv.relaxed.connection() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == {
                "synchronous_commit": "off"
            }
    finally:
        drv.close()


def test_the_state_pool_plans_generically_only_in_the_dispatchers_transactions(
    services: Services,
) -> None:
    """The queue's pools force generic plans (see db.pool.GENERIC_PLANS); the state pool only
    inside the Dispatcher's store transactions, and never past their end."""
    with services.pool.connection() as conn:
        assert conn.execute("SHOW plan_cache_mode").fetchone() == {"plan_cache_mode": "auto"}
    with services.dispatcher.store.transaction() as tx:
        assert tx.conn.execute("SHOW plan_cache_mode").fetchone() == {
            "plan_cache_mode": "force_generic_plan"
        }
    with services.pool.connection() as conn:  # the pool's connections come back as they were
        assert conn.execute("SHOW plan_cache_mode").fetchone() == {"plan_cache_mode": "auto"}


def test_pools_keep_the_environments_pgoptions(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """libpq takes the session options from PGOPTIONS when the DSN gives none; a pool that adds
    its own (GENERIC_PLANS) must keep them, as it keeps the DSN's (the state pool honoured
    PGOPTIONS before it set options)."""
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=4321")
    pool = make_pool(dsn, max_size=1, options=GENERIC_PLANS)
    try:
        assert settings_of(pool, "plan_cache_mode", "statement_timeout") == {
            "plan_cache_mode": "force_generic_plan",
            "statement_timeout": "4321ms",
        }
    finally:
        pool.close()


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def test_a_receive_reads_its_batch_off_the_index_whatever_the_statistics(dsn: str) -> None:
    """The receive's plan is made once per connection (generic plans), from the statistics of
    that moment. Planned on a fresh table (never analysed) and run over a backlog published
    since, it must still take its batch off queue_ready_idx in order: no bitmap scan of every
    ready row, no sort, no sequential scan (each receive would read the whole backlog)."""
    drv = PgQueue.from_dsn(dsn)
    try:
        drv.publish_many("q", [wake() for _ in range(3000)])
        held = [m.receipt for m in drv.receive("q", 2, 60)]
        names = {"receipts": "text", "visibility": "float8", "token": "uuid", "queue": "text"}
        text = _RECEIVE_SQL
        for i, (name, kind) in enumerate({**names, "limit": "int"}.items(), start=1):
            text = text.replace(f"%({name})s", f"${i}::{kind}")
        with drv.relaxed.connection() as conn:  # the pool's own session settings
            conn.execute(f"PREPARE receive_plan AS {text}")
            got = (
                psycopg.ClientCursor(conn)
                .execute(  # EXECUTE takes literals, not $n
                    "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE receive_plan(%s, 60, %s, 'q', 2)",
                    [",".join(held), str(uuid4())],
                )
                .fetchone()
            )
            conn.execute("DEALLOCATE receive_plan")
        nodes = list(_plan_nodes(next(iter(got.values()))[0]["Plan"]))
        kinds = {n["Node Type"] for n in nodes}
        assert not kinds & {"Sort", "Bitmap Heap Scan", "Seq Scan"}, kinds
        picks = [n for n in nodes if n.get("Index Name") == "queue_ready_idx"]
        assert len(picks) == 1 and picks[0]["Node Type"] == "Index Scan"
        # It read its 2 ready rows (and the 2 just acked, which it skips), not the backlog.
        assert picks[0]["Actual Rows"] == 2 and picks[0].get("Rows Removed by Filter", 0) <= 2
    finally:
        drv.close()
