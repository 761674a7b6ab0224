"""Migrations 0020-0024 applied to an install holding data (migrated to 0019 first): the
pool backfill, the reaper's restated indexes, the commits' range index and the whole writers'
columns serve the rows written before them, and the queue's batch leases (0024) leave what
was leased in place before them leased."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.support.queue_conformance import wake
from tests.support.servers import empty_database
from tests.support.tasks import bare_dataset
from trace_platform.contract import LITE_ORG_ID
from trace_platform.db import migrate as mig
from trace_platform.queue.pgqueue import PgQueue
from trace_platform.store.tasks.params import PoolKey, ReadsParams, TaskKey
from trace_platform.store.tasks.postgres import DISPATCHER_PLANS, PostgresTx


def _db_at(pg_server: str, monkeypatch: pytest.MonkeyPatch, version: str) -> Iterator[str]:
    """An empty database migrated up to `version`; `mig.migrate` then applies the rest."""
    everything = mig.available()
    with empty_database(pg_server) as db:
        monkeypatch.setattr(
            mig, "available", lambda: [m for m in everything if m.version <= version]
        )
        mig.migrate(db)
        monkeypatch.setattr(mig, "available", lambda: everything)
        yield db


@pytest.fixture
def db_at_0019(pg_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from _db_at(pg_server, monkeypatch, "0019")


@pytest.fixture
def db_at_0041(pg_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from _db_at(pg_server, monkeypatch, "0041")


def _task(
    conn: Any,
    status: str,
    *,
    dag_id: Any = None,
    pool: str | None = None,
    operator: str = "noop",
    **st: Any,
) -> Any:
    tid = uuid.uuid4()
    conn.execute(
        "INSERT INTO task_registry (task_id, start_day, org_id, dag_id, job, operator, runtime, "
        "timeout_seconds, max_attempts, retry_backoff_seconds, retry_backoff_max_seconds, "
        "worker_pool) VALUES (%s, trace_start_day(now()), %s, %s, 'j', %s, 'ecs_platform', "
        "3600, 3, 2, 300, %s)",
        [tid, LITE_ORG_ID, dag_id, operator, pool],
    )
    cols = ", ".join(["task_id", "start_day", "status", *st])
    vals = ", ".join(["%s", "trace_start_day(now())", "%s", *(f"{v}" for v in st.values())])
    conn.execute(f"INSERT INTO task_status ({cols}) VALUES ({vals})", [tid, status])
    return tid


def test_0020_to_0024_on_an_install_with_data(db_at_0019: str) -> None:
    with psycopg.connect(db_at_0019, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'o')", [LITE_ORG_ID])
        conn.execute(
            "INSERT INTO users (user_id, org_id, name) VALUES (gen_random_uuid(), %s, 'u')",
            [LITE_ORG_ID],
        )
        dag_id = conn.execute(
            "INSERT INTO dags (dag_id, org_id, name, owner_user_id) "
            "SELECT gen_random_uuid(), %s, 'd', user_id FROM users WHERE org_id = %s LIMIT 1 "
            "RETURNING dag_id",
            [LITE_ORG_ID, LITE_ORG_ID],
        ).fetchone()["dag_id"]
        conn.execute(
            "INSERT INTO pool_slots (dag_id, pool, slot_index) VALUES (%s, 'rpc', 0), (%s, 'rpc', 1)",
            [dag_id, dag_id],
        )
        queued = _task(conn, "queued", dag_id=dag_id, pool="rpc")
        buffered = _task(conn, "buffered", dag_id=dag_id, pool="rpc")
        running = _task(
            conn, "running", dag_id=dag_id, pool="rpc", attempt="1",
            lease_token="gen_random_uuid()", lease_until="now() - interval '1 minute'",
            deadline_at="now() + interval '1 hour'",
        )  # fmt: skip
        timed_out = _task(
            conn, "running", attempt="1", lease_token="gen_random_uuid()",
            lease_until="now() + interval '1 hour'", deadline_at="now() - interval '1 second'",
        )  # fmt: skip
        done = _task(conn, "succeeded", dag_id=dag_id, pool="rpc")
        whole = {"dag_id": dag_id, "pool": "whole:j", "operator": "sql_transform"}
        whole_queued = _task(conn, "queued", **whole)
        whole_running = _task(conn, "running", **whole, attempt="1")
        conn.execute(
            "INSERT INTO pool_slots (dag_id, pool, slot_index, leased_by_task, leased_job) "
            "VALUES (%s, 'whole:j', 0, %s, 'j')",
            [dag_id, whole_running],
        )
        plain = _task(conn, "queued")
        ds, (version,) = bare_dataset(conn, LITE_ORG_ID, dag_id, "ranges", "append")
        conn.execute(
            "INSERT INTO dataset_commits (commit_id, dataset_uuid, dataset_version, task_id, "
            "attempt, scope, range_start, range_end, location, row_count) "
            "SELECT gen_random_uuid(), %s, %s, gen_random_uuid(), 1, "
            "'range:' || 10 * g || '-' || 10 * g + 10, 10 * g, 10 * g + 10, 'mem://c/' || g, 1 "
            "FROM generate_series(0, 99) AS g",
            [ds, version],
        )
        # Queue rows as the old code leaves them: one leased in place, one ready.
        token = str(uuid.uuid4())
        leased = conn.execute(
            "INSERT INTO queue_messages (queue_name, payload, attempts, lease_token, lease_until)"
            " VALUES ('tasks', %s, 1, %s, now() + interval '1 hour') RETURNING id",
            [Jsonb(wake()), token],
        ).fetchone()["id"]
        conn.execute(
            "INSERT INTO queue_messages (queue_name, payload) VALUES ('tasks', %s)", [Jsonb(wake())]
        )
        conn.commit()

    assert mig.migrate(db_at_0019)[:5] == ["0020", "0021", "0022", "0023", "0024"]

    queue = PgQueue.from_dsn(db_at_0019)
    try:
        (ready,) = queue.receive("tasks", 20, 30)  # a batch lease; the leased row is skipped
        assert queue.ack_many("tasks", [ready.receipt, f"{leased}:{token}"]) == 2
    finally:
        queue.close()

    with psycopg.connect(db_at_0019, row_factory=dict_row) as conn:
        pools = {
            r["task_id"]: (r["pool_dag_id"], r["worker_pool"])
            for r in conn.execute("SELECT task_id, pool_dag_id, worker_pool FROM task_status")
        }
        assert pools[queued] == pools[buffered] == pools[running] == (dag_id, "rpc")
        assert pools[done] == pools[plain] == pools[timed_out] == (None, None)
        whole_jobs = {
            r["task_id"]: r["whole_job"]
            for r in conn.execute("SELECT task_id, whole_job FROM task_status")
        }
        assert whole_jobs[whole_queued] == whole_jobs[whole_running] == "j"
        assert {whole_jobs[t] for t in (queued, buffered, running, done, plain)} == {None}
        held = conn.execute(
            "SELECT pool, leased_whole FROM pool_slots WHERE leased_by_task IS NOT NULL"
        ).fetchall()
        assert [(r["pool"], r["leased_whole"]) for r in held] == [("whole:j", True)]
        conn.execute(DISPATCHER_PLANS)
        tx = PostgresTx(conn)
        assert tx.waiting_for_pool(PoolKey(dag_id, "rpc")) == [queued]
        assert tx.waiting_for_pool(PoolKey(dag_id, "whole:j")) == []  # its job holds the slot
        assert tx.waiting_for_job(dag_id, "j") == []  # a whole run of it holds a slot
        assert [(r["task_id"], r["timed_out"]) for r in tx.expired_leases(10)] == [
            (running, False),
            (timed_out, True),
        ]
        got = tx.committed_reads(
            ReadsParams(
                scoped=[], whole=[], appends=[version], own=[], scope="range:20-30",
                range_start=15, range_end=35,
            )
        )  # fmt: skip
        assert [r["range_start"] for r in got] == [10, 30]
        conn.rollback()
        # The buffered task, released, is found by its pool too (one per job: the queued one
        # done first).
        conn.execute("UPDATE task_status SET status = 'succeeded' WHERE task_id = %s", [queued])
        conn.execute("UPDATE task_status SET status = 'queued' WHERE task_id = %s", [buffered])
        conn.execute(DISPATCHER_PLANS)
        assert PostgresTx(conn).waiting_for_pool(PoolKey(dag_id, "rpc")) == [buffered]


def test_0042_moves_task_retries_into_their_tasks_months(db_at_0041: str) -> None:
    """0041's unpartitioned rows land in the month partition of their task's start_day (so
    retention drops them with it) and still give the task its fresh budget; a retry of a task
    no longer in Postgres is not carried over."""
    with psycopg.connect(db_at_0041, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'o')", [LITE_ORG_ID])
        retried = _task(conn, "queued", attempt="2")
        conn.execute(
            "INSERT INTO task_retries (task_id, after_attempt) VALUES (%s, 2), (%s, 1)",
            [retried, uuid.uuid4()],
        )
        conn.commit()

    assert mig.migrate(db_at_0041)[0] == "0042"

    with psycopg.connect(db_at_0041, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT tableoid::regclass::text AS part, task_id, start_day, after_attempt "
            "FROM task_retries"
        ).fetchall()
        (day,) = conn.execute("SELECT trace_start_day(now()) AS d").fetchone().values()
        (month,) = (
            conn.execute("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY_MM') AS m")
            .fetchone()
            .values()
        )
        assert rows == [
            {"part": f"task_retries_{month}", "task_id": retried, "start_day": day,
             "after_attempt": 2}
        ]  # fmt: skip
        assert PostgresTx(conn).untried_attempts(TaskKey(retried, day)) == 2


def test_0042_on_an_install_with_old_months_and_a_status_row_outliving_its_month(
    db_at_0041: str,
) -> None:
    """Several months of registry partitions (each gets its month of task_retries, the retry of
    a task four months old lands in it), and a retried task whose registry month retention
    dropped while its status row stayed (a report landing after its export): not in Postgres
    any more, its retry is not carried over, and the migration does not fail on it."""
    with psycopg.connect(db_at_0041, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'o')", [LITE_ORG_ID])
        conn.execute("SELECT trace_ensure_partitions(2, 6)")
        old = _task(conn, "failed", attempt="3")
        (day,) = (
            conn.execute(
                "SELECT trace_start_day(date_trunc('month', now() AT TIME ZONE 'UTC')"
                " - interval '4 months') AS d"
            )
            .fetchone()
            .values()
        )
        for t in ("task_registry", "task_status"):
            conn.execute(f"UPDATE {t} SET start_day = %s WHERE task_id = %s", [day, old])
        (gone_day,) = (
            conn.execute(
                "SELECT trace_start_day(date_trunc('month', now() AT TIME ZONE 'UTC')"
                " - interval '6 months') AS d"
            )
            .fetchone()
            .values()
        )
        orphan = uuid.uuid4()
        conn.execute(
            "INSERT INTO task_status (task_id, start_day, status) VALUES (%s, %s, 'failed')",
            [orphan, gone_day],
        )
        (part,) = (
            conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = 'task_registry'::regclass"
                " AND pg_get_expr(c.relpartbound, c.oid) LIKE %s",
                [f"%FROM ('{gone_day}')%"],
            )
            .fetchone()
            .values()
        )
        conn.execute(f"DROP TABLE {part}")  # retention's drop
        conn.execute(
            "INSERT INTO task_retries (task_id, after_attempt) VALUES (%s, 3), (%s, 1)",
            [old, orphan],
        )
        conn.commit()

    assert mig.migrate(db_at_0041)[0] == "0042"

    with psycopg.connect(db_at_0041, row_factory=dict_row) as conn:
        rows = conn.execute("SELECT task_id, start_day FROM task_retries").fetchall()
        assert rows == [{"task_id": old, "start_day": day}]
        assert PostgresTx(conn).untried_attempts(TaskKey(old, day)) == 3
        months = [
            conn.execute(
                "SELECT array_agg(pg_get_expr(c.relpartbound, c.oid) ORDER BY c.relname) AS b"
                " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = %s::regclass",
                [t],
            ).fetchone()["b"]
            for t in ("task_registry", "task_retries")
        ]
        assert months[0] == months[1] and len(months[0]) == 8  # 6 back, this one, 2 ahead, less 1
