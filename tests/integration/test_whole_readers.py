"""A whole-input reader (sql_transform) rewrites its output as one scope (`all`) from what was
committed when its attempt fetched; the last commit of that scope wins. Two runs at once can
therefore land the older read last, so a whole reader woken more than once (an analytic per
aggregated window) must run on a one-slot pool, which starts the next run only after the
previous one landed (tests/chaos/test_chain_identity.py's tip DAG is such a job)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.dags import admin
from trace_platform.contract import (
    ClaimRequest,
    CompleteRequest,
    EventIn,
    LeaseRef,
    OutputCommit,
    RangeSpec,
    TaskPayload,
)
from trace_platform.errors import Conflict
from trace_platform.services import Services

DAG = """
name: whole
{pools}
jobs:
  src:
    operator: noop
    outputs: [{{}}]
  supply:
    operator: sql_transform
    config: {{sql: "SELECT * FROM src"}}
    inputs: [{{job: src}}]
    outputs: [{{}}]
    {pool}
"""


def _lease(d: Any, task_id: Any) -> tuple[dict[str, Any], TaskPayload]:
    c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
    lease = {"task_id": task_id, "attempt": c.attempt, "lease_token": c.lease_token}
    return lease, d.fetch(LeaseRef(**lease))


def _src_range(services: Services, start: int, end: int) -> Any:
    """One run of `src` committing [start, end) and announcing it: returns the `supply` task
    it woke."""
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
                    location=f"{out.location}/range-{start}",
                )
            ],
            final_events=[EventIn(dataset_uuid=out.dataset_uuid, range=rng)],
        )
    )
    assert done.status == "succeeded" and done.tasks_created == 1
    with services.pool.connection() as conn:
        (row,) = conn.execute(
            "SELECT task_id FROM task_registry WHERE parent_task_id = %s", [src_id]
        ).fetchall()
    return row["task_id"]


def _read(payload: TaskPayload) -> list[int]:
    return sorted(c.range.start for c in payload.committed if c.range is not None)


def _land(d: Any, lease: dict[str, Any], payload: TaskPayload, tag: str) -> None:
    out = payload.outputs[0]
    commit = OutputCommit(dataset_uuid=out.dataset_uuid, location=f"{out.location}/{tag}")
    done = d.complete(CompleteRequest(**lease, outcome="succeeded", outputs=[commit]))
    assert done.status == "succeeded"


def _current_all(services: Services) -> str:
    with services.pool.connection() as conn:
        (row,) = conn.execute(
            "SELECT c.location FROM dataset_commits c JOIN datasets d USING (dataset_uuid) "
            "WHERE d.producer_job = 'supply' AND c.scope = 'all'"
        ).fetchall()
    return str(row["location"])


def test_two_runs_of_a_whole_reader_at_once_can_land_the_older_read_last(
    services: Services,
) -> None:
    d = services.dispatcher
    services.control.deploy(admin(services), DAG.format(pools="", pool=""))
    first = _src_range(services, 0, 100)
    older, older_read = _lease(d, first)
    second = _src_range(services, 100, 200)
    newer, newer_read = _lease(d, second)  # no pool: both run at once
    assert (_read(older_read), _read(newer_read)) == ([0], [0, 100])
    _land(d, newer, newer_read, "newer")
    _land(d, older, older_read, "older")
    assert _current_all(services).endswith("/older")  # the range [100, 200) is lost


def test_on_a_one_slot_pool_the_next_run_reads_what_the_previous_ones_read(
    services: Services,
) -> None:
    d = services.dispatcher
    pools = "worker_pools:\n  analytics:\n    - {}\n"
    services.control.deploy(admin(services), DAG.format(pools=pools, pool="worker_pool: analytics"))
    first = _src_range(services, 0, 100)
    older, older_read = _lease(d, first)
    second = _src_range(services, 100, 200)
    with pytest.raises(Conflict):  # waits for the slot the first run holds
        _lease(d, second)
    _land(d, older, older_read, "older")
    newer, newer_read = _lease(d, second)
    assert (_read(older_read), _read(newer_read)) == ([0], [0, 100])
    _land(d, newer, newer_read, "newer")
    assert _current_all(services).endswith("/newer")
