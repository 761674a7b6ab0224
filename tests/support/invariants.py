"""The invariants every scenario must leave behind (phase 7 of the Lite plan)."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

from trace_platform.services import Services


def assert_invariants(services: Services, *, allow_dead: int = 0) -> None:
    services.publisher.drain()
    assert_no_dead_holders(services)
    with services.pool.connection() as conn:
        stuck = conn.execute(
            "SELECT task_id FROM task_status WHERE status = 'running' AND lease_until < now()"
        ).fetchall()
        assert stuck == [], f"running tasks with expired leases: {stuck}"
        # No stale-attempt commit: a succeeded task's only succeeded attempt is its current one.
        stale = conn.execute(
            """SELECT a.task_id, a.attempt, s.attempt AS current
               FROM task_attempts a JOIN task_status s USING (task_id)
               WHERE a.outcome = 'succeeded' AND (s.status <> 'succeeded' OR a.attempt <> s.attempt)"""
        ).fetchall()
        assert stale == [], f"stale-attempt commits: {stale}"
        events = conn.execute(
            """SELECT e.producer_task_id, e.producer_attempt FROM events e
               JOIN task_attempts a ON a.task_id = e.producer_task_id AND a.attempt = e.producer_attempt
               WHERE a.outcome NOT IN ('succeeded', 'running')
                 AND e.created_at > a.finished_at"""
        ).fetchall()
        assert events == [], f"events accepted from an attempt after it ended: {events}"
        # No commit from an attempt that is not its task's current, succeeded one.
        commits = conn.execute(
            """SELECT c.task_id, c.attempt, c.scope, s.status, s.attempt AS current
               FROM dataset_commits c JOIN task_status s USING (task_id)
               WHERE s.status <> 'succeeded' OR c.attempt <> s.attempt"""
        ).fetchall()
        assert commits == [], f"commits of attempts that are not current and succeeded: {commits}"
        pending = conn.execute("SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL").fetchone()
        assert pending is not None and pending["n"] == 0, "outbox not drained"
        dead = conn.execute("SELECT count(*) AS n FROM queue_dead").fetchone()
        assert dead is not None and dead["n"] == allow_dead, f"queue_dead has {dead['n']} rows"
        lost = conn.execute(LOST_TASKS).fetchall()
        assert lost == [], f"queued tasks nothing will wake (lost): {lost}"
        orphans = conn.execute(
            """SELECT m.id, m.payload FROM queue_messages m
               WHERE m.payload ->> 'kind' = 'task_wakeup'
                 AND NOT EXISTS (SELECT 1 FROM task_status s
                                 WHERE s.task_id::text = m.payload ->> 'task_id')"""
        ).fetchall()
        assert orphans == [], f"wake-ups for tasks that do not exist: {orphans}"


def assert_no_dead_holders(services: Services) -> None:
    """No task is running under a worker process that is gone (its lease may not have run out
    yet: a lease-only check passes it)."""
    with services.pool.connection() as conn:
        running = conn.execute(
            "SELECT task_id, worker_id, lease_until FROM task_status WHERE status = 'running'"
        ).fetchall()
    held = [r for r in running if dead_local_worker(r["worker_id"])]
    assert held == [], f"running under a dead worker (lost until its lease runs out): {held}"


def dead_local_worker(worker_id: str | None) -> bool:
    """Whether a worker id (`host:pid:nonce`, see worker/wrapper.py) names a process of this
    machine that is gone: its task is lost until the lease runs out, which a lease-only check
    cannot see."""
    host, _, rest = (worker_id or "").partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not Path(f"/proc/{pid}").exists()


# A queued task is lost unless something will wake it: a wake-up in the queue (visible,
# delayed or held by a worker, in place or in a batch's lease row) or in the outbox, a leased
# slot of its pool (its release wakes the pool's waiting tasks), or its DAG's resume (paused).
LOST_TASKS = """
WITH held AS MATERIALIZED (
  -- The wake-ups batch leases hold: each lease's arrays read once, side by side (as the
  -- queue's `restore` does), not its payloads array once per message for every task.
  SELECT m.payload ->> 'task_id' AS task_id
  FROM queue_leases l,
       ROWS FROM (unnest(l.ids), jsonb_array_elements(l.payloads)) AS m(id, payload)
  WHERE (l.token, m.id) IN (SELECT h.token, unnest(h.held) FROM queue_leases h)
)
SELECT s.task_id, r.job, s.attempt
FROM task_status s
JOIN task_registry r ON r.task_id = s.task_id AND r.start_day = s.start_day
WHERE s.status = 'queued'
  AND NOT EXISTS (SELECT 1 FROM queue_messages m WHERE m.payload ->> 'task_id' = s.task_id::text)
  AND NOT EXISTS (SELECT 1 FROM held WHERE held.task_id = s.task_id::text)
  AND NOT EXISTS (SELECT 1 FROM outbox o
                  WHERE o.sent_at IS NULL AND o.payload ->> 'task_id' = s.task_id::text)
  AND NOT EXISTS (SELECT 1 FROM dags d WHERE d.dag_id = r.dag_id AND d.paused)
  AND NOT (r.worker_pool IS NOT NULL
           AND EXISTS (SELECT 1 FROM pool_slots p
                       WHERE p.dag_id = r.dag_id AND p.pool = r.worker_pool
                         AND p.leased_by_task IS NOT NULL))
ORDER BY r.job
"""


def expire_lease(services: Services, task_id: object) -> None:
    """What missed heartbeats look like to the reaper: the lease ran out a second ago."""
    with services.pool.connection() as conn:
        conn.execute(
            "UPDATE task_status SET lease_until = now() - interval '1 s' WHERE task_id = %s",
            (task_id,),
        )


def assert_datasets_complete(services: Services, span: tuple[int, int] | None = None) -> None:
    """Every published dataset's current version (buffered ones aside: the sink's rows, no
    commits) is complete: it has commits, its range commits
    tile one span with no gap or overlap (ranges are half-open) — exactly `span` [start, end)
    when given, so a lost first or last range is caught too — and each Parquet commit's files
    hold exactly the rows the commit recorded."""
    import io

    import pyarrow.parquet as pq

    from trace_platform.objectstore import list_all, make_store

    store = make_store(services.settings)
    with services.pool.connection() as conn:
        datasets = conn.execute(
            """SELECT ds.dataset_name, ds.backend, c.dataset_version FROM datasets ds
               JOIN dataset_current c USING (dataset_uuid) WHERE ds.dataset_name IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM buffered_datasets b
                                 WHERE b.dataset_uuid = ds.dataset_uuid)"""
        ).fetchall()
        for ds in datasets:
            commits = conn.execute(
                """SELECT scope, range_start, range_end, location, row_count FROM dataset_commits
                   WHERE dataset_version = %s ORDER BY range_start NULLS FIRST""",
                [ds["dataset_version"]],
            ).fetchall()
            name = ds["dataset_name"]
            assert commits, f"published dataset {name} has no commit in its current version"
            ranges = [
                (c["range_start"], c["range_end"]) for c in commits if c["range_start"] is not None
            ]
            for (_, a_end), (b_start, _) in itertools.pairwise(ranges):
                assert b_start == a_end, f"{name}: range commits leave a gap or overlap at {a_end}"
            if span is not None and ranges:
                held = (ranges[0][0], ranges[-1][1])
                assert held == span, f"{name}: range commits span {held}, not {span}"
            if ds["backend"] != "parquet":
                continue
            for c in commits:
                rows = sum(
                    pq.read_metadata(io.BytesIO(store.get(o.key))).num_rows
                    for o in list_all(store, c["location"])
                    if o.key.endswith(".parquet")
                )
                assert rows == c["row_count"], (
                    f"{name} {c['scope']}: {rows} rows, commit says {c['row_count']}"
                )
