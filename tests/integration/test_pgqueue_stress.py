"""Adversarial stress of pgqueue's lease statement: concurrent consumers receiving, nacking,
extending and acking with short leases. A trigger records every lease taken (the row as it
was before and the lease's statement time), so overlapping leases are seen by the database
itself, not inferred from client clocks."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

import psycopg
import pytest

from tests.support.queue_conformance import wake
from trace_platform.db.pool import make_pool
from trace_platform.db.queries import Queries
from trace_platform.queue.driver import Message
from trace_platform.queue.pgqueue import PgQueue

_LOG_LEASES = """
CREATE TABLE lease_log (
  id bigint, attempts int, old_lease_until timestamptz, old_token uuid,
  new_token uuid, at timestamptz, new_lease_until timestamptz);
CREATE FUNCTION log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.attempts <> OLD.attempts THEN
    INSERT INTO lease_log VALUES (OLD.id, NEW.attempts, OLD.lease_until, OLD.lease_token,
                                  NEW.lease_token, now(), NEW.lease_until);
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER log_lease AFTER UPDATE ON queue_messages FOR EACH ROW EXECUTE FUNCTION log_lease();
"""


@pytest.fixture
def logged_dsn(dsn: str) -> Iterator[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_LOG_LEASES)
    yield dsn


def test_concurrent_consumers_never_hold_overlapping_leases(logged_dsn: str) -> None:
    dsn = logged_dsn
    n_messages, n_threads, max_attempts = 300, 6, 50
    pub = PgQueue.from_dsn(dsn, max_attempts=max_attempts, poll_seconds=0.05)
    pub.publish_many("s", [wake() for _ in range(n_messages)])
    deliveries: dict[int, list[int]] = defaultdict(list)
    acked: set[int] = set()
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop = time.monotonic() + 12

    def consumer(seed: int) -> None:
        rnd = random.Random(seed)
        q = PgQueue.from_dsn(dsn, max_attempts=max_attempts, poll_seconds=0.05, max_size=2)
        pending: list[str] = []
        try:
            while time.monotonic() < stop:
                vis = rnd.choice([0.01, 0.02, 0.05, 0.2])
                batch = q.receive("s", rnd.randint(1, 8), vis, ack=pending)
                pending = []
                if not batch:
                    with lock:
                        if len(acked) == n_messages:
                            return
                    continue
                for m in batch:
                    mid = int(m.receipt.split(":")[0])
                    with lock:
                        deliveries[mid].append(m.delivery_count)
                    roll = rnd.random()
                    if roll < 0.3:
                        q.nack("s", m.receipt, "again")
                    elif roll < 0.5:
                        q.extend_visibility("s", m.receipt, rnd.choice([0.01, 0.1]))
                    elif roll < 0.65:
                        pass  # let the lease run out
                    elif roll < 0.8:
                        if q.ack("s", m.receipt):
                            with lock:
                                acked.add(mid)
                    else:
                        pending.append(m.receipt)  # acked by the next receive
                        with lock:
                            acked.add(mid)  # provisional: checked against the table below
        except BaseException as e:
            errors.append(e)
        finally:
            try:
                q.ack_many("s", pending)
            finally:
                q.close()

    threads = [threading.Thread(target=consumer, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pub.close()
    assert not errors, errors

    with psycopg.connect(dsn) as conn:
        overlapping = conn.execute(
            "SELECT * FROM lease_log WHERE old_lease_until IS NOT NULL AND old_lease_until >= at"
        ).fetchall()
        assert overlapping == []
        per_msg = conn.execute(
            "SELECT id, array_agg(attempts ORDER BY at, attempts) FROM lease_log GROUP BY id"
        ).fetchall()
        for _mid, attempts in per_msg:
            assert attempts == list(range(1, len(attempts) + 1)), attempts
        dead = conn.execute("SELECT count(*) FROM queue_dead").fetchone()
        left = conn.execute(
            "SELECT id, attempts, lease_until, visible_at FROM queue_messages"
        ).fetchall()
    # Client-side order is racy (a thread records after its receive returns); each delivery
    # count must still be handed out once.
    for mid, counts in deliveries.items():
        assert len(set(counts)) == len(counts), (mid, counts)
    # Nothing stranded: whatever is left can still be received (or is dead), once leases lapse.
    time.sleep(0.3)
    drain = PgQueue.from_dsn(dsn, max_attempts=max_attempts)
    try:
        got = {int(m.receipt.split(":")[0]) for m in drain.receive("s", 1000, 30)}
    finally:
        drain.close()
    assert dead is not None
    assert {row[0] for row in left} == got, (left, got)


def test_a_message_made_ready_under_a_receive_is_leased_by_it(dsn: str) -> None:
    """A receive's pick locks the newest version of each ready row (a row changed since the
    statement's snapshot is rechecked as it is now). A nack whose statement began before the
    receive's but committed after its snapshot leaves the message ready by the receive's
    clock: the pick locks it, so the lease must take it. Found by ctid, the lease looked for
    the version the pick locked through the statement's snapshot, which cannot see it: the
    message was locked, not leased and not returned (left for a later receive, which a
    consumer waits up to its poll interval for: a nack sends no NOTIFY)."""
    q = PgQueue(make_pool(dsn, max_size=2), dsn, max_attempts=5)
    try:
        q.publish("r", wake())
        settled = q.receive("r", 1, 30)[0]  # acked by the receive below, whose delete we hold
        q.publish("r", wake())
        lapsed = q.receive("r", 1, 0.05)[0]
        time.sleep(0.2)  # its lease ran out: ready again
        holder = psycopg.connect(dsn)
        holder.execute(
            "SELECT 1 FROM queue_messages WHERE id = %s FOR UPDATE",
            [int(settled.receipt.split(":")[0])],
        )
        nacker = psycopg.connect(dsn)
        nacker.execute("SELECT now()")  # the nack's transaction (and its now()) begins here
        got: list[Message] = []
        receiver = threading.Thread(
            target=lambda: got.extend(q.receive("r", 10, 30, ack=[settled.receipt]))
        )
        receiver.start()
        time.sleep(0.5)  # the receive took its snapshot and waits on the held row
        mid, token = lapsed.receipt.split(":")
        nacked = nacker.execute(
            Queries("queue").nack,
            {"queue": "r", "id": int(mid), "token": token, "error": "e", "delay": 0},
        ).fetchall()
        nacker.commit()
        assert len(nacked) == 1
        holder.rollback()
        receiver.join(10)
        assert [m.delivery_count for m in got] == [2]
        holder.close()
        nacker.close()
    finally:
        q.close()
        q.pool.close()


def test_a_receipt_whose_id_is_no_bigint_is_refused_before_anything_happens(dsn: str) -> None:
    """The receipt pattern took up to 19 digits, so an id past 2**63 - 1 passed the driver's
    check and failed in Postgres (a DataError, not the ValueError a malformed receipt gets;
    and `receive(ack=...)` then leased nothing)."""
    q = PgQueue(make_pool(dsn, max_size=2), dsn, max_attempts=5)
    try:
        q.publish("b", wake())
        token = "00000000-0000-4000-8000-000000000000"
        for bad in (f"{2**63}:{token}", f"{'9' * 19}:{token}"):
            with pytest.raises(ValueError, match="not a pgqueue receipt"):
                q.ack_many("b", [bad])
            with pytest.raises(ValueError, match="not a pgqueue receipt"):
                q.receive("b", 1, 30, ack=[bad])
            with pytest.raises(ValueError, match="not a pgqueue receipt"):
                q.ack("b", bad)
        assert len(q.receive("b", 1, 30, ack=[f"{2**63 - 1}:{token}"])) == 1
    finally:
        q.close()
        q.pool.close()
