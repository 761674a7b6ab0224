"""Outbox publisher: at-least-once, concurrent-safe, survives a crash between publish and mark."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter

from tests.support.wait import wait_for
from trace_platform.contract import TaskSpec
from trace_platform.dispatcher.outbox import OutboxPublisher
from trace_platform.services import Services

Q = "tasks"

_CRASHING_PUBLISHER = """
import sys
from trace_platform.config import Settings
from trace_platform.services import Services
from tests.support.wait import wait_for
svc = Services.build(Settings(state_dsn=sys.argv[1]), sys.argv[1])
svc.publisher.publish_once()
print("not reached")
"""


def _queued_ids(services: Services) -> Counter[str]:
    with services.pool.connection() as conn:
        rows = conn.execute("SELECT payload->>'task_id' AS t FROM queue_messages").fetchall()
    return Counter(r["t"] for r in rows)


def test_publisher_killed_between_publish_and_mark_sent(services: Services, dsn: str) -> None:
    ids = {
        str(services.dispatcher.create_task(TaskSpec(job="j", operator="noop")).task_id)
        for _ in range(5)
    }
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING_PUBLISHER, dsn],
        env={**os.environ, "TRACE_FAULTS": "outbox.after_publish"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr  # SIGKILLed at the fault point
    assert "not reached" not in proc.stdout
    assert _queued_ids(services) == Counter(ids)  # published …
    assert services.publisher.pending() == 5  # … but never marked sent
    # The dead process's backend holds its row locks until Postgres notices the closed
    # socket; SKIP LOCKED passes over them meanwhile, so drain until all five went out.
    drained = 0

    def all_sent() -> bool:
        nonlocal drained
        drained += services.publisher.drain()
        return drained >= 5

    wait_for(all_sent, 10, "the dead publisher's row locks to be released")
    assert drained == 5
    assert services.publisher.pending() == 0
    # Duplicate wake-ups, never a lost one.
    assert _queued_ids(services) == Counter({i: 2 for i in ids})


def test_concurrent_publishers_publish_each_row_once(services: Services) -> None:
    with services.pool.connection() as conn, conn.transaction():
        for _ in range(600):
            services.dispatcher.create_task(TaskSpec(job="j", operator="noop"), conn=conn)
    pubs = [OutboxPublisher(services.pool, services.driver, batch_size=50) for _ in range(4)]
    threads = [threading.Thread(target=p.drain) for p in pubs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts = _queued_ids(services)
    assert len(counts) == 600 and set(counts.values()) == {1}
    assert services.publisher.pending() == 0


def test_publish_failure_keeps_rows_pending(services: Services) -> None:
    class Down:
        def publish_many(self, *a: object, **k: object) -> None:
            raise ConnectionError("queue unreachable")

    services.dispatcher.create_task(TaskSpec(job="j", operator="noop"))
    broken = OutboxPublisher(services.pool, Down())  # type: ignore[arg-type]
    assert broken.publish_once() == 0
    with services.pool.connection() as conn:
        row = conn.execute("SELECT publish_errors, last_error FROM outbox").fetchone()
    assert row == {"publish_errors": 1, "last_error": "queue unreachable"}
    assert services.publisher.drain() == 1


def test_intent_rolled_back_leaves_no_outbox_row(services: Services) -> None:
    try:
        with services.pool.connection() as conn, conn.transaction():
            services.dispatcher.create_task(TaskSpec(job="j", operator="noop"), conn=conn)
            raise RuntimeError("caller fails after creating the task")
    except RuntimeError:
        pass
    assert services.publisher.pending() == 0
    with services.pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM task_status").fetchone() == {"n": 0}
