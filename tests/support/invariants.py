"""The invariants every scenario must leave behind (phase 7 of the Lite plan)."""

from __future__ import annotations

from trace_platform.services import Services


def assert_invariants(services: Services, *, allow_dead: int = 0) -> None:
    services.publisher.drain()
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
        pending = conn.execute("SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL").fetchone()
        assert pending is not None and pending["n"] == 0, "outbox not drained"
        dead = conn.execute("SELECT count(*) AS n FROM queue_dead").fetchone()
        assert dead is not None and dead["n"] == allow_dead, f"queue_dead has {dead['n']} rows"


def expire_lease(services: Services, task_id: object) -> None:
    """What missed heartbeats look like to the reaper: the lease ran out a second ago."""
    with services.pool.connection() as conn:
        conn.execute(
            "UPDATE task_status SET lease_until = now() - interval '1 s' WHERE task_id = %s",
            (task_id,),
        )
