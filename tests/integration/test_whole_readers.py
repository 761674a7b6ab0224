"""A whole-input reader (sql_transform) rewrites its output as one scope (`all`) from what was
committed when its attempt fetched; the last commit of that scope wins. Two runs at once could
therefore land the older read last, so the Dispatcher runs such a job one run at a time
(trace_platform.dag.whole): without a worker pool on an implicit one-slot pool of its own, on a
pool only with max_concurrency 1 (refused at deploy otherwise). The next run then claims (and
reads) only after the previous one landed, and an attempt that lost its slot to the reaper
lands nothing when it reports late."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.dags import admin, whole_dag
from trace_platform.contract import (
    ClaimRequest,
    CompleteRequest,
    EventIn,
    LeaseRef,
    OutputCommit,
    RangeSpec,
    TaskPayload,
)
from trace_platform.dag.validate import DagInvalid
from trace_platform.errors import Conflict
from trace_platform.layout import scope_prefix
from trace_platform.services import Services


def _lease(d: Any, task_id: Any) -> tuple[dict[str, Any], TaskPayload]:
    c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
    lease = {"task_id": task_id, "attempt": c.attempt, "lease_token": c.lease_token}
    return lease, d.fetch(LeaseRef(**lease))


def _src_range(services: Services, start: int, end: int) -> Any:
    """One run of `src` committing [start, end) and announcing it: returns the `supply` task
    it woke."""
    (task_id,) = _src_children(services, start, end)
    return task_id


def _src_children(services: Services, start: int, end: int) -> dict[Any, int]:
    """One run of `src` committing [start, end) and announcing it: the tasks it made, each with
    its DAG version (a rebuild in flight buffers one for the version it builds)."""
    cp, d = services.control, services.dispatcher
    (src_id,) = cp.trigger(admin(services), "whole")["tasks"]
    lease, payload = _lease(d, src_id)
    out = payload.outputs[0]
    rng = RangeSpec(start=start, end=end)
    done = d.complete(
        CompleteRequest(
            **lease,
            outcome="succeeded",
            outputs=[
                OutputCommit(
                    dataset_uuid=out.dataset_uuid,
                    range=rng,
                    location=scope_prefix(
                        str(out.location), lease["task_id"], lease["attempt"], rng=rng
                    ),
                )
            ],
            final_events=[EventIn(dataset_uuid=out.dataset_uuid, range=rng)],
        )
    )
    assert done.status == "succeeded"
    with services.pool.connection() as conn:
        rows = conn.execute(
            "SELECT task_id, dag_version FROM task_registry WHERE parent_task_id = %s", [src_id]
        ).fetchall()
    assert len(rows) == done.tasks_created
    return {r["task_id"]: r["dag_version"] for r in rows}


def _wakeups(services: Services, task_id: Any) -> int:
    """How many wake-ups of the task the outbox holds."""
    with services.pool.connection() as conn:
        (row,) = conn.execute(
            "SELECT count(*) AS n FROM outbox WHERE payload ->> 'task_id' = %s", [str(task_id)]
        ).fetchall()
    return int(row["n"])


def _read(payload: TaskPayload) -> list[int]:
    return sorted(c.range.start for c in payload.committed if c.range is not None)


def _own(lease: dict[str, Any], payload: TaskPayload) -> str:
    """Where this attempt commits its whole output."""
    return scope_prefix(str(payload.outputs[0].location), lease["task_id"], lease["attempt"])


def _land(d: Any, lease: dict[str, Any], payload: TaskPayload) -> str:
    out = payload.outputs[0]
    commit = OutputCommit(dataset_uuid=out.dataset_uuid, location=_own(lease, payload))
    done = d.complete(CompleteRequest(**lease, outcome="succeeded", outputs=[commit]))
    assert done.status == "succeeded"
    return str(commit.location)


def _first_run(services: Services, dag: str) -> tuple[Any, dict[str, Any], TaskPayload]:
    """`dag` deployed, `src` committing [0, 100), and the `supply` run it woke leased: (its
    task, its lease, what it read)."""
    services.control.deploy(admin(services), dag)
    first = _src_range(services, 0, 100)
    lease, read = _lease(services.dispatcher, first)
    return first, lease, read


def _current_all(services: Services) -> str:
    with services.pool.connection() as conn:
        (row,) = conn.execute(
            "SELECT c.location FROM dataset_commits c JOIN datasets d USING (dataset_uuid) "
            "WHERE d.producer_job = 'supply' AND c.scope = 'all'"
        ).fetchall()
    return str(row["location"])


def test_without_a_pool_two_runs_of_a_whole_reader_never_run_at_once(
    services: Services,
) -> None:
    """Before: both ran at once and the older read landed last, losing [100, 200)."""
    d = services.dispatcher
    _, older, older_read = _first_run(services, whole_dag())
    second = _src_range(services, 100, 200)
    with pytest.raises(Conflict, match="rewrites its output whole") as e:
        _lease(d, second)  # its implicit one-slot pool: waits for the first run
    assert e.value.code == "waiting_for_slot"
    wakeups = _wakeups(services, second)
    _land(d, older, older_read)
    assert _wakeups(services, second) == wakeups + 1  # the released slot wakes it
    newer, newer_read = _lease(d, second)
    assert (_read(older_read), _read(newer_read)) == ([0], [0, 100])
    landed = _land(d, newer, newer_read)
    assert _current_all(services) == landed


def test_a_late_success_after_the_reaper_took_the_slot_lands_nothing(
    services: Services,
) -> None:
    d = services.dispatcher
    first, older, older_read = _first_run(services, whole_dag())
    with services.pool.connection() as conn:
        conn.execute(
            "UPDATE task_status SET lease_until = now() - interval '1 s' WHERE task_id = %s",
            [first],
        )
    assert d.reap() == 1  # the first run's slot is free again
    second = _src_range(services, 100, 200)
    newer, newer_read = _lease(d, second)
    assert _read(newer_read) == [0, 100]
    landed = _land(d, newer, newer_read)
    out = older_read.outputs[0]
    late = OutputCommit(dataset_uuid=out.dataset_uuid, location=_own(older, older_read))
    done = d.complete(CompleteRequest(**older, outcome="succeeded", outputs=[late]))
    assert done.status == "queued" and done.outputs_committed == 0  # the reaper's retry stands
    assert _current_all(services) == landed
    attempt = d.get_task(first).attempts[-1]
    assert attempt.attempt == older["attempt"] and "lost its lease" in (attempt.error or "")
    retry, retry_read = _lease(d, first)  # the retry reads again, after the newer landed
    assert _read(retry_read) == [0, 100]
    landed = _land(d, retry, retry_read)
    assert _current_all(services) == landed


@pytest.mark.parametrize("pools", ["", "worker_pools:\n  analytics:\n    - {}\n    - {}\n"])
def test_a_whole_reader_above_max_concurrency_1_is_refused_at_deploy(
    services: Services, pools: str
) -> None:
    pool = ("worker_pool: analytics\n    " if pools else "") + "scaling: {max_concurrency: 2}"
    with pytest.raises(DagInvalid) as e:
        services.control.deploy(admin(services), whole_dag(pools, pool))
    assert "jobs.supply.scaling.max_concurrency" in str(e.value)
    assert "job 'supply' (sql_transform) rewrites its output whole" in str(e.value)


def test_on_a_one_slot_pool_the_next_run_reads_what_the_previous_ones_read(
    services: Services,
) -> None:
    d = services.dispatcher
    pools = "worker_pools:\n  analytics:\n    - {}\n"
    _, older, older_read = _first_run(services, whole_dag(pools, "worker_pool: analytics"))
    second = _src_range(services, 100, 200)
    with pytest.raises(Conflict):  # waits for the slot the first run holds
        _lease(d, second)
    _land(d, older, older_read)
    newer, newer_read = _lease(d, second)
    assert (_read(older_read), _read(newer_read)) == ([0], [0, 100])
    landed = _land(d, newer, newer_read)
    assert _current_all(services) == landed


def test_a_deploy_moving_a_whole_reader_to_a_pool_keeps_its_runs_one_at_a_time(
    services: Services,
) -> None:
    """The deploy retires `whole:supply` (the live version puts the job on `analytics`). The
    run that waited on it is not stranded, and a run of the new version, on the new pool, still
    waits for the one holding the old slot: each reads after the previous one landed."""
    d = services.dispatcher
    _, older, older_read = _first_run(services, whole_dag())
    second = _src_range(services, 100, 200)
    with pytest.raises(Conflict):
        _lease(d, second)
    pools = "worker_pools:\n  analytics:\n    - {}\n"
    services.control.deploy(admin(services), whole_dag(pools, "worker_pool: analytics"))
    third = _src_range(services, 200, 300)  # the new version's run, on `analytics`
    for waiting in (second, third):
        with pytest.raises(Conflict, match="rewrites its output whole"):
            _lease(d, waiting)
    wakeups = (_wakeups(services, second), _wakeups(services, third))
    _land(d, older, older_read)
    # One run woken, the job's oldest, not one per pool: only one could run.
    assert (_wakeups(services, second), _wakeups(services, third)) == (
        wakeups[0] + 1,
        wakeups[1],
    )
    newer, newer_read = _lease(d, second)
    with pytest.raises(Conflict, match="rewrites its output whole"):
        _lease(d, third)
    assert _read(newer_read) == [0, 100, 200]
    _land(d, newer, newer_read)
    assert _wakeups(services, third) == wakeups[1] + 1  # the old pool's release wakes it
    newest, newest_read = _lease(d, third)
    assert _read(newest_read) == [0, 100, 200]
    landed = _land(d, newest, newest_read)
    assert _current_all(services) == landed


def test_a_woken_run_a_superseded_rebuild_cancels_gives_its_place_to_the_jobs_next(
    services: Services,
) -> None:
    """Version 2 rebuilds `supply`; the release of the live run wakes the job's oldest run,
    the rebuild's. A newer deploy abandons that rebuild, canceling its run before it claimed:
    the live version's waiting run is woken in its place (before: not until the rewake)."""
    d = services.dispatcher
    _, older, older_read = _first_run(services, whole_dag())
    services.control.deploy(admin(services), whole_dag().replace("FROM src", "FROM src AS a"))
    with services.pool.connection() as conn:
        (rebuild,) = conn.execute(
            "SELECT task_id FROM task_registry WHERE job = 'supply' AND dag_version = 2"
        ).fetchall()
    live_next = next(t for t, v in _src_children(services, 100, 200).items() if v == 1)
    before = (_wakeups(services, rebuild["task_id"]), _wakeups(services, live_next))
    _land(d, older, older_read)
    assert (_wakeups(services, rebuild["task_id"]), _wakeups(services, live_next)) == (
        before[0] + 1,
        before[1],
    )
    services.control.deploy(admin(services), whole_dag().replace("FROM src", "FROM src AS b"))
    assert d.get_task(rebuild["task_id"]).status == "canceled"
    assert _wakeups(services, live_next) == before[1] + 1
    _, read = _lease(d, live_next)
    assert _read(read) == [0, 100]
