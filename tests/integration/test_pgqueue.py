"""pgqueue passes the QueueDriver conformance suite, plus checks specific to its tables."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support.queue_conformance import QueueDriverConformance, wake
from trace_platform.db.pool import make_pool
from trace_platform.queue.driver import QueueDriver
from trace_platform.queue.pgqueue import PgQueue


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
