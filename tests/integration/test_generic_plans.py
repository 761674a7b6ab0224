"""The task listings take their LIMIT as a literal (db.queries.literal_limit), so they stay
index reads under any plan mode. A generic plan (force_generic_plan, as the queue's pools set
it and an operator may set server-wide) takes `LIMIT $1` for a tenth of the rows: a
newest-first listing, whose custom plan reads the first rows off the created_at index, became
a hash join of every task and a sort (about 300 ms at 400,000 tasks instead of 3, growing with
the table). And the Dispatcher's statements read each task by key, whatever the statistics
their plan was made from: a handful of tasks, analysed or not; a long history of finished
tasks beside a burst of new ones not yet analysed; a few dataset versions holding many
commits."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tests.support.tasks import bare_dataset, queue_tasks
from trace_platform.contract import LITE_ORG_ID
from trace_platform.operators import WHOLE_OUTPUT_OPERATORS
from trace_platform.services import Services
from trace_platform.store.task_views import TaskViewStore
from trace_platform.store.tasks.params import (
    ClaimManyParams,
    ClaimParams,
    HeartbeatParams,
    LeaseCheck,
    NewTask,
    PoolKey,
    ReadsParams,
)
from trace_platform.store.tasks.postgres import DISPATCHER_PLANS, PostgresStore, PostgresTx

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


def _running(conn: Any, n: int) -> list[Any]:
    """`n` new running tasks (leased for an hour, no statistics taken): their status rows."""
    ids = queue_tasks(conn, n)
    return conn.execute(
        """
        UPDATE task_status
        SET status = 'running', attempt = 1, lease_token = gen_random_uuid(),
            lease_until = now() + interval '1 hour', deadline_at = now() + interval '1 hour',
            started_at = now(), heartbeat_at = now()
        WHERE task_id = ANY(%s)
        RETURNING task_id, attempt, lease_token
        """,
        [ids],
    ).fetchall()


def test_a_heartbeat_reads_its_task_by_key(dsn: str) -> None:
    """A heartbeat names its task, attempt and lease, and that the task runs. Planned from
    statistics in which running tasks were a handful, `status = 'running'` made a scan of a
    whole partial index of running rows (task_status_deadline_idx) look cheaper than the key:
    it read every running task of the partition (500 of 2,000), on every heartbeat."""
    with psycopg.connect(dsn, row_factory=dict_row, autocommit=True) as conn:
        queue_tasks(conn, 6)
        _running(conn, 2)
        conn.execute("ANALYZE")
        leases = _running(conn, 2_000)  # a fleet at work, not yet analysed
    with psycopg.connect(dsn, row_factory=dict_row, prepare_threshold=0) as conn:
        conn.execute(DISPATCHER_PLANS)
        before = _rows_read(conn)
        r = leases[0]
        beat = HeartbeatParams(r["task_id"], r["attempt"], r["lease_token"], 60.0, None)
        assert PostgresTx(conn).heartbeat(beat) is not None
        read = _rows_read(conn) - before
        stale = HeartbeatParams(r["task_id"], r["attempt"], uuid.uuid4(), 60.0, None)
        assert PostgresTx(conn).heartbeat(stale) is None  # another lease: refused
    assert read < 10, f"task rows read: {read}"


def test_a_burst_beside_a_long_history_is_read_by_key(services: Services, dsn: str) -> None:
    """A long-lived install's statistics are of finished tasks: queued and running ones look
    rare (and a burst of them goes unanalysed until autovacuum counts a tenth of the table's
    rows changed). A lookup by key and status then took the status index over the key (it
    reads as well correlated with the table): a lone claim read every queued task of its
    partition (5,000 of a burst of 20,000), the batch claim as many for each task, a
    heartbeat every running task of its partition through a partial index of running rows.
    And a freed pool slot's wake-ups read every queued task once per task of the pool."""
    _populate(services)  # 100,000 finished tasks
    with services.pool.connection() as conn:
        conn.autocommit = True
        conn.execute("ANALYZE")  # every table, as autovacuum has
    with services.pool.connection() as conn:
        queue_tasks(conn, 20_000)
        running = _running(conn, 2_000)
        queued = queue_tasks(conn, 4)
        dag_id = conn.execute(
            "INSERT INTO dags (dag_id, org_id, name, owner_user_id) "
            "SELECT gen_random_uuid(), %s, 'pooled', user_id FROM users WHERE org_id = %s "
            "LIMIT 1 RETURNING dag_id",
            [LITE_ORG_ID, LITE_ORG_ID],
        ).fetchone()["dag_id"]
        conn.execute(
            "INSERT INTO pool_slots (dag_id, pool, slot_index) "
            "SELECT %s, 'rpc', i FROM generate_series(0, 1) AS i",
            [dag_id],
        )
        pooled = queue_tasks(conn, 6, worker_pool="rpc", dag_id=dag_id)
    read: dict[str, int] = {}
    with psycopg.connect(dsn, row_factory=dict_row, prepare_threshold=0) as conn:
        tx = PostgresTx(conn)
        conn.execute(DISPATCHER_PLANS)

        def counted(name: str, call: Any) -> Any:
            before = _rows_read(conn)
            got = call()
            read[name] = _rows_read(conn) - before
            return got

        r = running[0]
        beat = HeartbeatParams(r["task_id"], r["attempt"], r["lease_token"], 60.0, None)
        assert counted("heartbeat", lambda: tx.heartbeat(beat)) is not None
        claim = ClaimParams(queued[0], "w", 60.0, pooled=False)
        assert counted("claim", lambda: tx.claim(claim)) is not None
        batch = queued[1:]
        many = ClaimManyParams(batch, ["w"] * len(batch), 60.0, [None] * len(batch))
        assert len(counted("claim_many", lambda: tx.claim_many(many))) == len(batch)
        woken = counted("waiting_for_pool", lambda: tx.waiting_for_pool(PoolKey(dag_id, "rpc")))
        assert len(woken) == 1 and woken[0] in pooled  # one job, max_concurrency 1
        assert counted("stranded_queued", lambda: tx.stranded_queued(600, 100)) == []
        assert counted("expired_leases", lambda: tx.expired_leases(100)) == []
        conn.rollback()
    # The reaper reads the running rows (their leases are not indexed: migration 0040), and
    # none of the history or the backlog; every other statement reads by key.
    assert read.pop("expired_leases") < len(running) + 10, f"task rows read: {read}"
    assert all(n < 100 for n in read.values()), f"task rows read: {read}"


def test_committed_reads_read_each_scope_by_key(services: Services) -> None:
    """What an attempt reads of its inputs' and outputs' commits (at each claim and fetch) is
    one scope of each version it names. As one scan filtered by an OR of its four arrays, the
    generic plan (which cannot tell the empty arrays) read every commit of every version:
    with two versions of 20,000 scopes, 40,000 rows for two."""
    with services.pool.connection() as conn:
        user = conn.execute("SELECT user_id FROM users WHERE org_id = %s LIMIT 1", [LITE_ORG_ID])
        owner = user.fetchone()["user_id"]
        dag_id = conn.execute(
            "INSERT INTO dags (dag_id, org_id, name, owner_user_id) "
            "VALUES (gen_random_uuid(), %s, 'big', %s) RETURNING dag_id",
            [LITE_ORG_ID, owner],
        ).fetchone()["dag_id"]
        versions = []
        for i in range(2):
            ds, (version,) = bare_dataset(conn, LITE_ORG_ID, dag_id, f"big_{i}", "replace", i)
            conn.execute(
                "INSERT INTO dataset_commits (commit_id, dataset_uuid, dataset_version, task_id, "
                "attempt, scope, partition_key, location, row_count) "
                "SELECT gen_random_uuid(), %s, %s, gen_random_uuid(), 1, 'partition:' || g, "
                "g::text, 'mem://c/' || g, 1 FROM generate_series(1, 20000) AS g",
                [ds, version],
            )
            versions.append(version)
    with services.pool.connection() as conn:
        conn.autocommit = True
        conn.execute("ANALYZE dataset_commits")
    reads = ReadsParams(
        scoped=[versions[0]],
        whole=[],
        appends=[],
        own=[versions[1]],
        scope="partition:7",
        range_start=None,
        range_end=None,
    )
    with services.dispatcher.store.transaction() as tx:
        before = _commits_read(tx.conn)
        got = tx.committed_reads(reads)
        read = _commits_read(tx.conn) - before
    assert [(r["dataset_version"], r["scope"]) for r in got] == sorted(
        (v, "partition:7") for v in versions
    )
    assert read < 10, f"commit rows read: {read}"


def _commits_read(conn: Any) -> int:
    row = conn.execute(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) AS n "
        "FROM pg_stat_xact_user_tables WHERE relname = 'dataset_commits'"
    ).fetchone()
    return int(row["n"])


def _dag(conn: Any, *, paused: bool = False) -> Any:
    return conn.execute(
        "INSERT INTO dags (dag_id, org_id, name, owner_user_id, paused) "
        "SELECT gen_random_uuid(), %s, 'd-' || gen_random_uuid(), user_id, %s FROM users "
        "WHERE org_id = %s LIMIT 1 RETURNING dag_id",
        [LITE_ORG_ID, paused, LITE_ORG_ID],
    ).fetchone()["dag_id"]


def _counted(conn: Any, call: Any) -> tuple[Any, int]:
    """What `call` returned and the task rows it read, in the Dispatcher's plan settings (its
    transaction rolled back)."""
    conn.execute(DISPATCHER_PLANS)
    before = _rows_read(conn)
    got = call(PostgresTx(conn))
    read = _rows_read(conn) - before
    conn.rollback()
    return got, read


def test_the_rewake_reads_only_the_stranded_tasks(services: Services, dsn: str) -> None:
    """The reaper's rewake (every tick) looks for queued tasks nobody touched for a while. It
    read every queued task through the live status index and kept the stale ones: 20,000 rows
    at a backlog of 20,000, on every tick, for none. It reads the queued tasks oldest first off
    an index of their last update, up to the first one touched since."""

    def connect() -> Any:
        return psycopg.connect(dsn, row_factory=dict_row, prepare_threshold=0)

    with connect() as early, connect() as late:
        assert _counted(early, lambda tx: tx.stranded_queued(600, 100))[0] == []  # a new install
        queue_tasks(early, 20_000)  # a backlog, just woken
        stale = queue_tasks(early, 7)
        early.execute(
            "UPDATE task_status SET updated_at = now() - make_interval(hours => 2, secs => n) "
            "FROM unnest(%s::uuid[]) WITH ORDINALITY AS u(task_id, n) "
            "WHERE task_status.task_id = u.task_id",
            [stale],
        )
        # Stale but not claimable: a cancel requested, a retry waiting, a paused DAG.
        early.execute(
            "UPDATE task_status SET cancel_requested = true WHERE task_id = %s", [stale[0]]
        )
        early.execute(
            "UPDATE task_status SET next_attempt_at = now() + interval '1 hour' WHERE task_id = %s",
            [stale[1]],
        )
        early.execute(
            "UPDATE task_registry SET dag_id = %s WHERE task_id = %s",
            [_dag(early, paused=True), stale[2]],
        )
        early.commit()
        read = {}
        for name, conn in (("planned before the backlog", early), ("planned over it", late)):
            got, read[name] = _counted(conn, lambda tx: tx.stranded_queued(600, 100))
            assert sorted(r["task_id"] for r in got) == sorted(stale[3:])
            got, _ = _counted(conn, lambda tx: tx.stranded_queued(600, 2))
            assert [r["task_id"] for r in got] == stale[-1:-3:-1]  # the oldest first
    assert all(n < 100 for n in read.values()), f"task rows read: {read}"


def test_the_reaper_reads_the_running_tasks_and_nothing_else(dsn: str) -> None:
    """The reaper's look for expired leases (every tick) reads the running rows once, off an
    index of them keyed by task_id, and filters their leases and deadlines on the heap: a lease
    is not indexed, so a heartbeat is a heap-only update (migration 0040). It reads none of the
    history (finished tasks, the bulk of every table) nor the queued backlog, whatever the
    statistics its plan was made from, and it locks the expired ones by key."""

    def connect() -> Any:
        return psycopg.connect(dsn, row_factory=dict_row, prepare_threshold=0)

    with connect() as early, connect() as late:
        assert _counted(early, lambda tx: tx.expired_leases(100))[0] == []  # a new install
        done = queue_tasks(early, 20_000)  # a history of finished tasks, and a backlog
        early.execute("UPDATE task_status SET status = 'succeeded' WHERE task_id = ANY(%s)", [done])
        queue_tasks(early, 5_000)
        running = _running(early, 2_000)  # a fleet at work, leased for an hour
        lost = [r["task_id"] for r in _running(early, 3)]
        early.execute(
            "UPDATE task_status SET lease_until = now() - make_interval(secs => 10 * n) "
            "FROM unnest(%s::uuid[]) WITH ORDINALITY AS u(task_id, n) "
            "WHERE task_status.task_id = u.task_id",
            [lost[:2]],
        )
        early.execute(  # its timeout passed, its lease still held
            "UPDATE task_status SET deadline_at = now() - interval '1 second' WHERE task_id = %s",
            [lost[2]],
        )
        early.commit()
        read = {}
        for name, conn in (("planned before the fleet", early), ("planned over it", late)):
            got, read[name] = _counted(conn, lambda tx: tx.expired_leases(100))
            assert [(r["task_id"], r["timed_out"]) for r in got] == [
                (lost[1], False),
                (lost[0], False),
                (lost[2], True),
            ]
            got, _ = _counted(conn, lambda tx: tx.expired_leases(1))
            assert [r["task_id"] for r in got] == [lost[1]]
    bound = len(running) + len(lost) + 20  # the running rows, then each expired one by key
    assert all(n < bound for n in read.values()), f"task rows read: {read}"


def test_a_heartbeat_is_a_heap_only_update(dsn: str) -> None:
    """A heartbeat changes no indexed column, so it can be a HOT update (no index entry, its
    old version pruned with the page): the table's commonest write. Each heartbeat commits, as
    the Dispatcher's do; this backend's statistics are flushed before each count."""
    with psycopg.connect(dsn, row_factory=dict_row, autocommit=True, prepare_threshold=0) as conn:
        leases = _running(conn, 50)
        conn.execute("VACUUM task_status")  # the queued versions the claims left, gone

        def counts() -> tuple[int, int]:
            conn.execute("SELECT pg_stat_force_next_flush()")  # flushed as this backend idles
            row = conn.execute(
                "SELECT sum(n_tup_upd) AS upd, sum(n_tup_hot_upd) AS hot "
                "FROM pg_stat_user_tables WHERE relname LIKE 'task\\_status\\_p%%'"
            ).fetchone()
            return int(row["upd"]), int(row["hot"])

        upd0, hot0 = counts()
        conn.execute(DISPATCHER_PLANS)
        tx = PostgresTx(conn)
        for _ in range(3):
            for r in leases:
                beat = HeartbeatParams(r["task_id"], r["attempt"], r["lease_token"], 60.0, {"n": 1})
                assert tx.heartbeat(beat) is not None
        upd, hot = counts()
    assert upd - upd0 == 3 * len(leases)
    # Most, not all: a HOT update needs room on its page, made by pruning the row's older
    # versions, which Postgres skips while another scan pins the page. Before 0040, none was.
    assert hot - hot0 >= (upd - upd0) * 2 / 3, f"{hot - hot0} of {upd - upd0} heartbeats were HOT"


def _pooled(conn: Any, dag_id: Any, n: int, job: str, operator: str = "noop") -> list[Any]:
    """n queued tasks of the job in the DAG's pool `rpc`, as the Dispatcher makes them."""
    tasks = [
        NewTask(
            task_id=uuid.uuid4(), org_id=LITE_ORG_ID, dag_id=dag_id, dag_version=1, job=job,
            operator=operator, runtime="ecs_platform", config={}, parent_task_id=None,
            input_event_id=None, input_event=None, input_versions=[], outputs=[],
            run_id=None, worker_pool="rpc", max_concurrency=None, timeout_seconds=3600,
            max_attempts=3, retry_backoff_seconds=2, retry_backoff_max_seconds=300,
            whole_job=job if operator in WHOLE_OUTPUT_OPERATORS else None,
        )
        for _ in range(n)
    ]  # fmt: skip
    PostgresTx(conn).insert_tasks(tasks)
    return [t.task_id for t in tasks]


def test_a_freed_slot_reads_only_its_pools_queued_tasks(services: Services, dsn: str) -> None:
    """A freed pool slot wakes the pool's queued tasks. They were found among every task the
    pool ever ran (the registry by DAG and pool), each one's status then read by key to keep the
    queued ones: 20,000 rows for a pool's history of 20,000, on every slot released, growing
    with the pool's age. Now read off an index of the queued tasks of each pool."""
    with services.pool.connection() as conn:
        dag_id = _dag(conn)
        conn.execute(
            "INSERT INTO pool_slots (dag_id, pool, slot_index) "
            "SELECT %s, 'rpc', i FROM generate_series(0, 2) AS i",
            [dag_id],
        )

    def pooled(conn: Any, n: int, job: str = "j") -> list[Any]:
        return _pooled(conn, dag_id, n, job)

    def connect() -> Any:
        return psycopg.connect(dsn, row_factory=dict_row, prepare_threshold=0)

    with connect() as early, connect() as late:
        first = pooled(early, 2)
        early.commit()
        assert len(_counted(early, lambda tx: tx.waiting_for_pool(PoolKey(dag_id, "rpc")))[0]) == 1
        history = pooled(early, 20_000)  # the pool's past: every task ran
        early.execute(
            "UPDATE task_status SET status = 'succeeded', finished_at = now() "
            "WHERE task_id = ANY(%s)",
            [[*history, *first]],
        )
        queue_tasks(early, 20_000)  # other work queued meanwhile
        waiting = pooled(early, 3) + pooled(early, 2, job="k")
        early.commit()
        read = {}
        for name, conn in (("planned before the history", early), ("planned over it", late)):
            got, read[name] = _counted(conn, lambda tx: tx.waiting_for_pool(PoolKey(dag_id, "rpc")))
            # One task of each job (max_concurrency 1), of three free slots.
            assert len(got) == 2 and {got[0], got[1]} <= set(waiting)
            assert (got[0] in waiting[:3]) != (got[1] in waiting[:3])
    assert all(n < 100 for n in read.values()), f"task rows read: {read}"


def test_an_append_reads_only_the_commits_overlapping_its_range(services: Services) -> None:
    """An append output's committed scopes overlapping the attempt's range (for its unique key)
    were found among every commit of the version, each filtered by its range: 20,000 rows for a
    version of 20,000 ranges, at every claim of every range. Read by range, wherever the range
    lies in the version."""
    with services.pool.connection() as conn:
        dag_id = _dag(conn)
        ds, versions = bare_dataset(conn, LITE_ORG_ID, dag_id, "ranges", "append", versions=2)
        for version in versions:  # two versions of the same ranges: [10g, 10g + 10)
            conn.execute(
                "INSERT INTO dataset_commits (commit_id, dataset_uuid, dataset_version, task_id, "
                "attempt, scope, range_start, range_end, location, row_count) "
                "SELECT gen_random_uuid(), %s, %s, gen_random_uuid(), 1, "
                "'range:' || 10 * g || '-' || 10 * g + 10, 10 * g, 10 * g + 10, "
                "'mem://c/' || g, 1 FROM generate_series(0, 19999) AS g",
                [ds, version],
            )
    with services.pool.connection() as conn:
        conn.autocommit = True
        conn.execute("ANALYZE dataset_commits")
    read = {}
    for start in (15, 100_005, 199_975):  # the first ranges, the middle, the last
        reads = ReadsParams(
            scoped=[],
            whole=[],
            appends=[versions[0]],
            own=[],
            scope=f"range:{start + 5}-{start + 15}",  # a re-run of its own range: not read
            range_start=start,
            range_end=start + 20,
        )
        with services.dispatcher.store.transaction() as tx:
            before = _commits_read(tx.conn)
            got = tx.committed_reads(reads)
            read[start] = _commits_read(tx.conn) - before
        base = start - 5
        assert [(r["dataset_version"], r["range_start"]) for r in got] == [
            (versions[0], base),
            (versions[0], base + 20),
        ]
    assert all(n < 10 for n in read.values()), f"commit rows read: {read}"


def test_a_whole_writers_release_reads_only_its_jobs_queued_runs(
    services: Services, dsn: str
) -> None:
    """The release of a whole writer's slot wakes its runs queued in other pools of its DAG.
    Found among every queued task of the DAG (20,000 here, of other jobs), that read 20,001
    rows on every such release; read off an index of whole writers' queued runs now."""
    with services.pool.connection() as conn:
        dag_id = _dag(conn)
        conn.execute(
            "INSERT INTO pool_slots (dag_id, pool, slot_index) VALUES (%s, 'rpc', 0)", [dag_id]
        )

    def pooled(conn: Any, n: int, job: str, operator: str = "noop") -> list[Any]:
        return _pooled(conn, dag_id, n, job, operator)

    def connect() -> Any:
        return psycopg.connect(dsn, row_factory=dict_row, prepare_threshold=0)

    with connect() as early, connect() as late:
        pooled(early, 2, "j")
        early.commit()
        assert _counted(early, lambda tx: tx.waiting_for_job(dag_id, "w"))[0] == []
        pooled(early, 20_000, "j")  # the DAG's other work, queued in the same pool
        runs = pooled(early, 2, "w", "sql_transform")
        early.commit()
        read = {}
        for name, conn in (("planned before the backlog", early), ("planned over it", late)):
            got, read[name] = _counted(conn, lambda tx: tx.waiting_for_job(dag_id, "w"))
            assert len(got) == 1 and got[0] in runs  # made together: either is oldest
    assert all(n < 100 for n in read.values()), f"task rows read: {read}"


_SETTINGS = (
    "SELECT current_setting('plan_cache_mode') AS plans, current_setting('enable_seqscan') AS seq,"
    " current_setting('jit') AS jit"
)
_STORE = {"plans": "force_generic_plan", "seq": "off", "jit": "off"}


def test_the_store_runs_with_its_plan_settings_and_the_state_pool_keeps_postgres_choice(
    services: Services,
) -> None:
    """A service's store has a pool of its own whose sessions carry the plan settings (no
    round trip per transaction for them); the state pool, which the listings and ad hoc reads
    use, keeps the server's."""
    store = services.dispatcher.store
    assert isinstance(store, PostgresStore) and store.pool is not services.pool
    with store.transaction() as tx:
        assert tx.conn.execute(_SETTINGS).fetchone() == _STORE
    with services.pool.connection() as conn:
        assert conn.execute(_SETTINGS).fetchone() == {"plans": "auto", "seq": "on", "jit": "on"}


def test_a_store_on_a_shared_pool_sets_its_plan_settings_in_each_transaction(
    services: Services,
) -> None:
    store = PostgresStore(services.pool)
    with store.transaction() as tx:
        assert tx.conn.execute(_SETTINGS).fetchone() == _STORE
    with services.pool.connection() as conn:  # transaction-local: nothing left on the session
        assert conn.execute(_SETTINGS).fetchone() == {"plans": "auto", "seq": "on", "jit": "on"}
