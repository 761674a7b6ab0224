"""The task listings take their LIMIT as a literal (db.queries.literal_limit), so they stay
index reads under any plan mode. A generic plan (force_generic_plan, as the queue's pools set
it and an operator may set server-wide) takes `LIMIT $1` for a tenth of the rows: a
newest-first listing, whose custom plan reads the first rows off the created_at index, became
a hash join of every task and a sort (about 300 ms at 400,000 tasks instead of 3, growing with
the table). And the batch claim and completion read each task by key, whatever the
statistics."""

from __future__ import annotations

from typing import Any

from trace_platform.contract import LITE_ORG_ID
from trace_platform.services import Services
from trace_platform.store.task_views import TaskViewStore
from trace_platform.store.tasks.params import ClaimManyParams, LeaseCheck

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


def test_batch_claims_and_completions_read_their_tasks_by_key(services: Services) -> None:
    """claim_many and complete_fast_many read each requested task by key, whatever the
    statistics say. Planned (generically, as the Dispatcher's transactions plan) over a burst
    of queued tasks the statistics have not seen yet, their plain join read every queued task
    through the status index and kept the requested ones."""
    with services.pool.connection() as conn:
        conn.execute(
            """
            INSERT INTO task_registry (task_id, start_day, org_id, job, operator, runtime,
              timeout_seconds, max_attempts, retry_backoff_seconds, retry_backoff_max_seconds)
            SELECT gen_random_uuid(), trace_start_day(now()), %s, 'j', 'noop', 'ecs_platform',
                   3600, 3, 2, 300
            FROM generate_series(1, 20000)
            """,
            [LITE_ORG_ID],
        )
        conn.execute(
            "INSERT INTO task_status (task_id, start_day) SELECT task_id, start_day "
            "FROM task_registry"
        )
        ids = [r["task_id"] for r in conn.execute("SELECT task_id FROM task_status LIMIT 5")]
    store = services.dispatcher.store
    with store.transaction() as tx:
        before = _rows_read(tx.conn)
        claimed = tx.claim_many(ClaimManyParams(ids, ["w"] * len(ids), 60.0))
        claim_read = _rows_read(tx.conn) - before
    assert sorted(r["task_id"] for r in claimed) == sorted(ids)
    checks = [LeaseCheck(r["task_id"], r["attempt"], r["lease_token"]) for r in claimed]
    with store.transaction() as tx:
        before = _rows_read(tx.conn)
        done = tx.complete_fast_many(checks)
        complete_read = _rows_read(tx.conn) - before
    assert done == set(ids)
    assert claim_read < 100, f"a claim of 5 read {claim_read} task rows"
    assert complete_read < 100, f"a completion of 5 read {complete_read} task rows"
