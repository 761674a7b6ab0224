"""pgqueue passes the QueueDriver conformance suite, plus checks specific to its tables."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from tests.support.queue_conformance import QueueDriverConformance, wake
from trace_platform.db.pool import GENERIC_PLANS, make_pool
from trace_platform.db.queries import Queries
from trace_platform.queue import pgqueue
from trace_platform.queue.driver import QueueDriver
from trace_platform.queue.pgqueue import BATCH_LEASE_MIN, PgQueue
from trace_platform.services import Services

_RECEIVE_SQL = Queries("queue").receive


class TestPgQueueConformance(QueueDriverConformance):
    @pytest.fixture(params=["in_place", "batch_leases"])
    def driver(
        self, dsn: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[PgQueue]:
        # The production set-up (autocommit pools, relaxed acks). A long poll interval proves
        # idle consumers are woken by NOTIFY, not by polling. Every receive leased in place,
        # then every one as a batch lease (migration 0024).
        monkeypatch.setattr(pgqueue, "BATCH_LEASE_MIN", 10**9 if request.param == "in_place" else 1)
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


def test_a_small_receive_leases_in_place(pgq: PgQueue, dsn: str) -> None:
    pgq.publish("q", wake())
    msg = pgq.receive("q", 1, 30)[0]
    msg_id, token = msg.receipt.split(":")
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT lease_token FROM queue_messages WHERE id = %s", (int(msg_id),)
        ).fetchone()
        assert conn.execute("SELECT count(*) FROM queue_leases").fetchone() == (0,)
    assert row is not None and str(row[0]) == token
    with pytest.raises(ValueError, match="not a pgqueue receipt"):
        pgq.ack("q", "garbage")


def test_a_large_batch_is_held_in_one_lease_row_its_acks_thin_out(pgq: PgQueue, dsn: str) -> None:
    """The lease per batch (migration 0024): a receive of BATCH_LEASE_MIN or more moves its
    messages out of queue_messages into one queue_leases row named by the receipts' token;
    each ack takes its message out of the row, and the last one deletes it."""
    n = BATCH_LEASE_MIN
    pgq.publish_many("q", [wake() for _ in range(n)])
    batch = pgq.receive("q", n, 30)
    ids = sorted(int(m.receipt.split(":")[0]) for m in batch)
    (token,) = {m.receipt.split(":")[1] for m in batch}

    def held() -> list[tuple[str, list[int]]]:
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM queue_messages").fetchone() == (0,)
            rows = conn.execute("SELECT token, held FROM queue_leases").fetchall()
        return [(str(t), sorted(i)) for t, i in rows]

    assert len(ids) == n and held() == [(token, ids)]
    first = int(batch[0].receipt.split(":")[0])
    assert pgq.ack("q", batch[0].receipt)
    assert not pgq.ack("q", batch[0].receipt)  # once
    assert held() == [(token, [i for i in ids if i != first])]
    assert pgq.ack_many("q", [m.receipt for m in batch]) == n - 1
    assert held() == []


def test_rows_leased_in_place_by_an_older_version_are_honoured(pgq: PgQueue, dsn: str) -> None:
    """A rolling upgrade: rows an older version leased in queue_messages itself are not picked
    while their lease runs, their receipts still ack them, and an expired one is delivered."""
    live, gone = str(uuid.uuid4()), str(uuid.uuid4())
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "INSERT INTO queue_messages (queue_name, payload, attempts, lease_token, lease_until)"
            " VALUES ('q', %s, 1, %s, now() + interval '1 hour'),"
            "        ('q', %s, 1, %s, now() - interval '1 second') RETURNING id",
            (json.dumps(wake()), live, json.dumps(wake()), gone),
        ).fetchall()
    (again,) = pgq.receive("q", 10, 30)  # the expired one only
    assert again.receipt.startswith(f"{rows[1][0]}:") and again.delivery_count == 2
    assert not pgq.ack("q", f"{rows[1][0]}:{gone}")  # its old lease is over
    assert pgq.extend_visibility("q", f"{rows[0][0]}:{live}", 60)
    assert pgq.ack("q", f"{rows[0][0]}:{live}")
    assert pgq.ack("q", again.receipt)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM queue_messages").fetchone() == (0,)


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
                    [pgqueue._grouped(held), str(uuid4())],
                )
                .fetchone()
            )
            conn.execute("DEALLOCATE receive_plan")
        nodes = list(_plan_nodes(next(iter(got.values()))[0]["Plan"]))
        # Sorts of the caller's receipts (grouped by batch to settle them), of the batches
        # they name (locked in token order) and of the picked batch (for its lease row) are
        # the only ones: none reads the backlog.
        cheap = re.compile(r"(settled|picked)\..*|l(_\d+)?\.token")
        costly = [
            (n["Node Type"], n.get("Relation Name"), n.get("Sort Key"))
            for n in nodes
            if n["Node Type"] in ("Sort", "Seq Scan", "Bitmap Heap Scan")
            and not all(cheap.fullmatch(k) for k in n.get("Sort Key") or ["-"])
        ]
        assert costly == []
        picks = [n for n in nodes if n.get("Index Name") == "queue_ready_idx"]
        assert len(picks) == 1 and picks[0]["Node Type"] == "Index Scan"
        # It read its 2 ready rows (and the 2 just acked, which it skips), not the backlog.
        assert picks[0]["Actual Rows"] == 2 and picks[0].get("Rows Removed by Filter", 0) <= 2
    finally:
        drv.close()


def test_two_acks_of_a_batch_at_once_both_land(pgq: PgQueue, dsn: str) -> None:
    """Found by review: the second of two acks of a batch's last two messages, blocked behind
    the first, released nothing and thinned nothing (its conditions were decided on its
    snapshot), so its message was delivered again after it was acked."""
    n = BATCH_LEASE_MIN
    pgq.publish_many("q", [wake() for _ in range(n)])
    batch = pgq.receive("q", n, 30)
    assert pgq.ack_many("q", [m.receipt for m in batch[:-2]]) == n - 2
    first, second = batch[-2:]
    settle = Queries("queue").ack_many
    with psycopg.connect(dsn) as one, psycopg.connect(dsn) as two:
        got = {
            "one": one.execute(
                settle, {"queue": "q", "receipts": pgqueue._grouped([first.receipt])}
            )
        }
        blocked = threading.Thread(
            target=lambda: got.update(
                two=two.execute(
                    settle, {"queue": "q", "receipts": pgqueue._grouped([second.receipt])}
                )
            )
        )
        blocked.start()
        time.sleep(0.5)  # the second waits on the first's row lock
        assert blocked.is_alive()
        one.commit()
        blocked.join(10)
        two.commit()
        assert got["one"].fetchone() == (1,) and got["two"].fetchone() == (1,)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM queue_leases").fetchone() == (0,)


def test_ack_many_counts_only_what_was_held(pgq: PgQueue) -> None:
    """Found by review: receipts of a batch's messages already acked or nacked, or of ids it
    never held, were counted as acked."""
    n = BATCH_LEASE_MIN
    pgq.publish_many("q", [wake() for _ in range(n)])
    b = pgq.receive("q", n, 30)
    token = b[0].receipt.split(":")[1]
    assert pgq.ack("q", b[0].receipt)
    assert pgq.ack_many("q", [b[0].receipt, b[1].receipt]) == 1
    assert pgq.nack("q", b[2].receipt, "again")
    assert pgq.ack_many("q", [b[2].receipt, b[3].receipt]) == 1
    assert pgq.ack_many("q", [b[4].receipt, f"999999:{token}", f"999998:{token}"]) == 1


def test_a_failed_restore_does_not_lose_the_batch_just_leased(
    pgq: PgQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: the receive's batch is committed before the expired leases are put
    back; a failure then raised, and the batch (its delivery counted) reached no one."""
    n = BATCH_LEASE_MIN
    pgq.publish_many("q", [wake() for _ in range(2 * n)])
    assert len(pgq.receive("q", n, 0.2)) == n
    time.sleep(0.3)  # that lease runs out

    def broken(queue_name: str) -> int:
        raise psycopg.OperationalError("the database went away")

    monkeypatch.setattr(pgq, "_restore", broken)
    got = pgq.receive("q", n, 30)
    assert len(got) == n and all(m.delivery_count == 1 for m in got)
    assert pgq.ack_many("q", [m.receipt for m in got]) == n


def test_a_nack_of_the_last_held_message_ends_its_batch(pgq: PgQueue, dsn: str) -> None:
    """Found by review: the row was left holding nothing until its lease ran out (waking
    pollers early and costing a restore)."""
    n = BATCH_LEASE_MIN
    pgq.publish_many("q", [wake() for _ in range(n)])
    batch = pgq.receive("q", n, 30)
    assert pgq.ack_many("q", [m.receipt for m in batch[:-1]]) == n - 1
    assert pgq.nack("q", batch[-1].receipt, "again")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM queue_leases").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM queue_messages").fetchone() == (1,)


def test_a_batch_lease_is_extended_whole_and_set_exactly_once_down_to_one(
    pgq: PgQueue, dsn: str
) -> None:
    """Extending one message of a batch extends the batch (its siblings share the row), and
    never shortens it while others are held; down to one message, it is set as asked."""
    n = BATCH_LEASE_MIN
    pgq.publish_many("q", [wake() for _ in range(n)])
    batch = pgq.receive("q", n, 30)

    def left() -> float:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT extract(epoch FROM lease_until - now())::float8 FROM queue_leases"
            ).fetchone()
        assert row is not None
        return float(row[0])

    assert pgq.extend_visibility("q", batch[0].receipt, 120)
    assert 110 < left() <= 120
    assert pgq.extend_visibility("q", batch[1].receipt, 5)  # others held: not shortened
    assert 110 < left() <= 120
    assert pgq.ack_many("q", [m.receipt for m in batch[1:]]) == n - 1
    assert pgq.extend_visibility("q", batch[0].receipt, 0.2)  # alone: exactly
    assert left() <= 0.2
    time.sleep(0.4)
    again = pgq.receive("q", n, 30)
    assert len(again) == 1 and again[0].delivery_count == 2
    assert not pgq.extend_visibility("q", batch[0].receipt, 30)  # that lease is over


def test_settles_naming_the_same_batches_in_opposite_orders_do_not_deadlock(
    pgq: PgQueue, dsn: str
) -> None:
    """Found by review: the batches a settle names were locked in the receipts' order. Here a
    third session holds the first batch (in token order); one settle names it first and
    waits; the other names the second batch first. Locked in receipt order, the other took
    the second batch and waited for the first: once the first was free, a deadlock."""
    n = BATCH_LEASE_MIN
    pgq.publish_many("q", [wake() for _ in range(2 * n)])
    low, high = sorted(
        (pgq.receive("q", n, 30), pgq.receive("q", n, 30)), key=lambda b: b[0].receipt[-36:]
    )
    settle = Queries("queue").ack_many
    forward = pgqueue._grouped([low[0].receipt, high[0].receipt])
    backward = pgqueue._grouped([high[1].receipt, low[1].receipt])
    with (
        psycopg.connect(dsn) as holder,
        psycopg.connect(dsn, options=pgqueue.QUEUE_PLANS) as one,  # as the driver plans
        psycopg.connect(dsn, options=pgqueue.QUEUE_PLANS) as two,
    ):
        holder.execute(
            "SELECT 1 FROM queue_leases WHERE token = %s FOR UPDATE", [low[0].receipt[-36:]]
        )
        got: dict[str, Any] = {}

        def run(name: str, conn: psycopg.Connection[Any], receipts: str) -> None:
            try:
                got[name] = conn.execute(settle, {"queue": "q", "receipts": receipts}).fetchone()
                conn.commit()
            except psycopg.Error as e:
                got[name] = e

        threads = [
            threading.Thread(target=run, args=("one", one, forward)),
            threading.Thread(target=run, args=("two", two, backward)),
        ]
        for t in threads:
            t.start()
            time.sleep(0.3)  # one queues on the held batch before two starts
        holder.commit()
        for t in threads:
            t.join(15)
    assert got == {"one": (2,), "two": (2,)}


def test_a_token_spelled_in_capitals_settles_the_same_batch(pgq: PgQueue) -> None:
    """Found by review: a receipt's token in capitals (a uuid all the same) was a group of its
    own, and the settle thinned the batch by one group only."""
    n = BATCH_LEASE_MIN
    pgq.publish_many("q", [wake() for _ in range(n)])
    batch = pgq.receive("q", n, 30)

    def shout(receipt: str) -> str:
        msg_id, token = receipt.split(":")
        return f"{msg_id}:{token.upper()}"

    receipts = [shout(m.receipt) if i % 2 else m.receipt for i, m in enumerate(batch)]
    assert pgq.ack_many("q", receipts) == n
    assert pgq.receive("q", n, 30) == []


def test_a_receive_of_more_batches_than_the_stack_is_deep_gets_them_all(
    pgq: PgQueue, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches follow one another in a loop: a receive of more batches than Python's
    recursion limit (as a batch of BATCH_LEASE_MAX = 1 makes it) gets every message, each
    batch leased once (recursing, it stopped at the limit with the rest left queued)."""
    monkeypatch.setattr(pgqueue, "BATCH_LEASE_MAX", 1)
    n = sys.getrecursionlimit() + 100
    pgq.publish_many("q", [wake() for _ in range(n)])
    got = pgq.receive("q", n, 30)
    assert len(got) == n and len({m.receipt for m in got}) == n
    with psycopg.connect(dsn) as conn:
        # A batch each while 16 or more were still wanted; the last few leased in place.
        in_batches = n - (BATCH_LEASE_MIN - 1)
        assert conn.execute("SELECT count(*) FROM queue_leases").fetchone() == (in_batches,)
        assert conn.execute("SELECT count(*) FROM queue_messages").fetchone() == (n - in_batches,)
    assert pgq.receive("q", n, 30) == []
    assert pgq.ack_many("q", [m.receipt for m in got]) == n


def test_a_lease_shorter_than_its_receive_gives_each_message_once(
    pgq: PgQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: a receive whose own batches expired before it ended (a lease shorter
    than the call) put them back and leased them again, returning each message several times
    in one call. Its own batches wait for the next receive, like any other expired lease."""
    monkeypatch.setattr(pgqueue, "BATCH_LEASE_MAX", 5)
    pgq.publish_many("q", [wake() for _ in range(20)])
    got = pgq.receive("q", 40, 0)
    ids = [m.receipt.split(":")[0] for m in got]
    assert len(ids) == 20 == len(set(ids))
    assert {m.delivery_count for m in got} == {1}
    again = pgq.receive("q", 40, 30)  # expired: back, and leased by the next receive
    assert sorted(m.receipt.split(":")[0] for m in again) == sorted(ids)
    assert {m.delivery_count for m in again} == {2}


def test_a_receive_above_the_cap_is_several_batches_and_each_is_put_back_whole(
    pgq: PgQueue, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receive of more than BATCH_LEASE_MAX is leased as batches of at most that many (each
    ack rewrites its batch's row); expired, each puts back exactly what it still held, as it
    was (payload, delivery count)."""
    monkeypatch.setattr(pgqueue, "BATCH_LEASE_MAX", 40)
    pgq.publish_many("q", [wake() for _ in range(100)])
    got = pgq.receive("q", 100, 0.5)
    assert len(got) == 100 and len({m.receipt.split(":")[1] for m in got}) == 3
    with psycopg.connect(dsn) as conn:
        sizes = conn.execute("SELECT cardinality(held) FROM queue_leases ORDER BY 1").fetchall()
    assert sizes == [(20,), (40,), (40,)]
    acked = got[::3]
    assert pgq.ack_many("q", [m.receipt for m in acked]) == len(acked)
    time.sleep(0.6)
    again = pgq.receive("q", 200, 30)  # restored at once and leased in the same call
    key = lambda p: p["task_id"]  # noqa: E731
    assert sorted(map(key, (m.payload for m in again))) == sorted(
        key(m.payload) for m in got if m not in acked
    )
    assert all(m.payload == wake(uuid.UUID(m.payload["task_id"])) for m in again)
    assert {m.delivery_count for m in again} == {2}
    assert pgq.ack_many("q", [m.receipt for m in again]) == len(again)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM queue_leases").fetchone() == (0,)
