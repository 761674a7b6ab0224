"""The task listings take their LIMIT as a literal (db.queries.literal_limit), so they stay
index reads under any plan mode. A generic plan (force_generic_plan, as the queue's pools set
it and an operator may set server-wide) takes `LIMIT $1` for a tenth of the rows: a
newest-first listing, whose custom plan reads the first rows off the created_at index, became
a hash join of every task and a sort (about 300 ms at 400,000 tasks instead of 3, growing with
the table). And the Dispatcher's statements read each task by key, whatever the statistics
their plan was made from: a handful of tasks, analysed or not."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from tests.support.tasks import queue_tasks
from trace_platform.contract import LITE_ORG_ID
from trace_platform.services import Services
from trace_platform.store.task_views import TaskViewStore
from trace_platform.store.tasks.params import (
    ClaimManyParams,
    ClaimParams,
    HeartbeatParams,
    LeaseCheck,
)
from trace_platform.store.tasks.postgres import DISPATCHER_PLANS, PostgresTx

TASKS = 100_000


def _populate(services: Services) -> None:
    with services.pool.connection() as conn:
        # Two years of monthly partitions (none is ever dropped), as a deployment has.
        conn.execute("SELECT trace_ensure_partitions(2, 24)")
        conn.execute(
            """
            INSERT INTO task_registry (task_id, start_day, org_id, job, operator, runtime,
              timeout_seconds, max_attempts, retry_backoff_seconds, retry_backoff_max_seconds,
              created_at)
            SELECT gen_random_uuid(), trace_start_day(now()), %s, 'j', 'noop', 'ecs_platform',
                   3600, 3, 2, 300, now() - make_interval(secs => g)
            FROM generate_series(1, %s) AS g
            """,
            [LITE_ORG_ID, TASKS],
        )
        conn.execute(
            "INSERT INTO task_status (task_id, start_day, status) "
            "SELECT task_id, start_day, 'succeeded' FROM task_registry"
        )
    with services.pool.connection() as conn:
        conn.autocommit = True
        conn.execute("ANALYZE task_registry")
        conn.execute("ANALYZE task_status")


def _rows_read(conn: Any) -> int:
    """Task rows this transaction's backend read (a parallel plan's workers read more)."""
    row = conn.execute(
        "SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0) AS n "
        "FROM pg_stat_xact_user_tables "
        "WHERE relname LIKE 'task_status%' OR relname LIKE 'task_registry%'"
    ).fetchone()
    return int(row["n"])


def test_the_task_listings_read_only_the_newest_tasks(services: Services) -> None:
    _populate(services)
    listings = {
        "org_tasks": lambda conn: TaskViewStore(conn).org_tasks(org_id=LITE_ORG_ID, limit=50),
        "list_tasks": lambda conn: services.dispatcher.store.adopt(conn).list_tasks(50),
    }
    for name, listing in listings.items():
        with services.pool.connection() as conn, conn.transaction():
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            before = _rows_read(conn)
            got = listing(conn)
            rows = got.fetchall() if hasattr(got, "fetchall") else got
            read = _rows_read(conn) - before
        assert len(rows) == 50
        assert read < 1_000, f"{name} read {read} task rows for 50"


def _flow(conn: Any, ids: list[Any]) -> dict[str, int]:
    """Claims ids[1:] together and ids[0] alone (its lease expired at once), looks for expired
    leases, then completes them the same way, each statement in the Dispatcher's plan settings
    (DISPATCHER_PLANS): the task rows each one read."""
    tx = PostgresTx(conn)
    read: dict[str, int] = {}

    def counted(name: str, call: Any) -> Any:
        before = _rows_read(conn)
        got = call()
        read[name] = _rows_read(conn) - before
        return got

    conn.execute(DISPATCHER_PLANS)
    lone, batch = ids[0], ids[1:]
    claimed = counted(
        "claim_many",
        lambda: tx.claim_many(
            ClaimManyParams(batch, ["w"] * len(batch), 60.0, [None] * len(batch))
        ),
    )
    assert sorted(r["task_id"] for r in claimed) == sorted(batch)
    first = claimed[0]
    beat = HeartbeatParams(first["task_id"], first["attempt"], first["lease_token"], 60.0, None)
    assert counted("heartbeat", lambda: tx.heartbeat(beat)) is not None
    # The lone one's lease runs out at once: the reaper's tick finds it.
    one = counted("claim", lambda: tx.claim(ClaimParams(lone, "w", 0.0, pooled=False)))
    assert one is not None
    assert counted("task_view", lambda: tx.task_view(lone)) is not None
    assert counted("status_for_update", lambda: tx.status_for_update(lone)) is not None
    counted("touch", lambda: tx.touch(batch))
    conn.commit()
    conn.execute(DISPATCHER_PLANS)
    expired = counted("expired_leases", lambda: tx.expired_leases(100))
    assert [r["task_id"] for r in expired] == [lone]
    checks = [LeaseCheck(r["task_id"], r["attempt"], r["lease_token"]) for r in claimed]
    assert counted("complete_fast_many", lambda: tx.complete_fast_many(checks)) == set(batch)
    check = LeaseCheck(lone, one["attempt"], one["lease_token"])
    assert counted("complete_fast", lambda: tx.complete_fast(check))
    conn.commit()
    return read


def test_claims_and_completions_read_their_tasks_by_key(dsn: str) -> None:
    """Claims and plain completions, batched or not, read each task by key whatever the
    statistics say. A connection's generic plans are made at their first run. Made over a
    burst of new tasks the statistics had not seen, the batches' plain joins read every
    queued task through the status index; made while a fresh install held a handful of tasks,
    a lone completion's update and the reaper's look for expired leases hash-joined a
    sequential scan of every task."""

    def connect() -> Any:
        return psycopg.connect(dsn, row_factory=dict_row, prepare_threshold=0)

    with connect() as early, connect() as late:
        early.execute(DISPATCHER_PLANS)
        assert PostgresTx(early).expired_leases(100) == []  # a new install's first tick
        early.commit()
        _flow(early, queue_tasks(early, 6))  # its other plans made now, over a handful
        queue_tasks(early, 20_000)  # a burst the statistics have not seen
        early.commit()
        read = {
            "planned before the burst": _flow(early, queue_tasks(early, 6)),
            "planned over it": _flow(late, queue_tasks(late, 6)),
        }
    assert all(n < 100 for r in read.values() for n in r.values()), f"task rows read: {read}"


def test_plans_made_over_a_handful_of_analysed_tasks_read_by_key(dsn: str) -> None:
    """A new install's tables hold a handful of rows when autovacuum first analyses them: a plan
    made then finds a sequential scan (one page) cheaper than any index, and a join with the
    requests cheaper hashed. Kept for the connection, it read every task after a burst: the
    batch claim 336,000 task rows, a heartbeat or a lone claim a whole partition. The
    Dispatcher's plan settings turn sequential scans off, and its statements reach every
    task by key."""

    def connect() -> Any:
        return psycopg.connect(dsn, row_factory=dict_row, prepare_threshold=0)

    with connect() as early, connect() as late:
        ids = queue_tasks(early, 6)
        early.commit()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ANALYZE")
        _flow(early, ids)  # its plans made now, from the statistics of a handful
        queue_tasks(early, 20_000)  # a burst the statistics have not seen
        early.commit()
        read = {
            "planned before the burst": _flow(early, queue_tasks(early, 6)),
            "planned over it": _flow(late, queue_tasks(late, 6)),
        }
    assert all(n < 100 for r in read.values() for n in r.values()), f"task rows read: {read}"
