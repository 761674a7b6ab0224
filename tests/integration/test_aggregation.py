"""Read-only inputs and operator state saved by compare-and-set (what range_aggregator needs)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.dags import admin
from tests.support.wait import wait_for
from trace_platform.contract import (
    ClaimRequest,
    CompleteRequest,
    EventIn,
    LeaseRef,
    RangeSpec,
    TaskPayload,
)
from trace_platform.errors import Conflict
from trace_platform.services import Services

DAG = """
name: agg
jobs:
  src:
    operator: noop
    outputs: [{}]
  windows:
    operator: range_aggregator
    config: {size: 100}
    inputs: [{job: src}]
    outputs: [{}]
  reader:
    operator: noop
    inputs:
      - {job: src, triggers: false}
      - {job: windows}
"""


def _lease(d: Any, task_id: Any) -> tuple[dict[str, Any], TaskPayload]:
    c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
    lease = {"task_id": task_id, "attempt": c.attempt, "lease_token": c.lease_token}
    return lease, d.fetch(LeaseRef(**lease))


def _try_lease(d: Any, task_id: Any) -> tuple[dict[str, Any], TaskPayload] | None:
    try:
        return _lease(d, task_id)
    except Conflict:  # still backing off (a jittered moment after a state conflict)
        return None


def _src_tasks(services: Services, n: int) -> tuple[list[Any], TaskPayload]:
    """Runs `src`, emitting n range events: each wakes `windows` (and never `reader`)."""
    cp, d = services.control, services.dispatcher
    cp.deploy(admin(services), DAG)
    (src_id,) = cp.trigger(admin(services), "agg")["tasks"]
    lease, payload = _lease(d, src_id)
    out = payload.outputs[0].dataset_uuid
    events = [
        EventIn(dataset_uuid=out, range=RangeSpec(start=i * 50, end=(i + 1) * 50)) for i in range(n)
    ]
    done = d.complete(CompleteRequest(**lease, outcome="succeeded", final_events=events))
    assert done.tasks_created == n
    with services.pool.connection() as conn:
        rows = conn.execute(
            "SELECT r.task_id, r.job FROM task_registry r WHERE r.parent_task_id = %s", [src_id]
        ).fetchall()
    assert {r["job"] for r in rows} == {"windows"}  # the non-triggering input woke nothing
    return [r["task_id"] for r in rows], payload


def test_a_read_only_input_is_pinned_but_does_not_start_the_job(services: Services) -> None:
    d = services.dispatcher
    tasks, src_payload = _src_tasks(services, 1)
    lease, payload = _lease(d, tasks[0])
    win = payload.outputs[0].dataset_uuid
    ev = EventIn(dataset_uuid=win, range=RangeSpec(start=0, end=100))
    assert (
        d.complete(CompleteRequest(**lease, outcome="succeeded", final_events=[ev])).tasks_created
        == 1
    )
    with services.pool.connection() as conn:
        (reader,) = conn.execute(
            "SELECT task_id FROM task_registry WHERE job = 'reader'"
        ).fetchall()
    _, rp = _lease(d, reader["task_id"])
    assert [i.dataset_uuid for i in rp.inputs] == [src_payload.outputs[0].dataset_uuid, win]
    assert rp.inputs[0].dataset_version == src_payload.outputs[0].dataset_version


def test_operator_state_is_saved_by_compare_and_set(services: Services) -> None:
    d = services.dispatcher
    tasks, _ = _src_tasks(services, 2)
    (la, pa), (lb, pb) = _lease(d, tasks[0]), _lease(d, tasks[1])
    assert pa.operator_state_revision == pb.operator_state_revision == 0
    win = pa.outputs[0].dataset_uuid
    ev = EventIn(dataset_uuid=win, range=RangeSpec(start=0, end=100))
    first = d.complete(
        CompleteRequest(
            **la,
            outcome="succeeded",
            operator_state={"covered": [[0, 50]]},
            operator_state_revision=pa.operator_state_revision,
        )
    )
    assert first.status == "succeeded"
    # Both read revision 0: the second save would lose the first range, so it is refused and
    # its attempt retried; nothing it reported lands.
    second = d.complete(
        CompleteRequest(
            **lb,
            outcome="succeeded",
            final_events=[ev],
            operator_state={"covered": [[50, 100]]},
            operator_state_revision=pb.operator_state_revision,
        )
    )
    assert second.status == "queued" and second.tasks_created == 0
    with services.pool.connection() as conn:
        row = conn.execute(
            "SELECT state, revision FROM operator_state WHERE job = 'windows'"
        ).fetchone()
        assert (row["state"], row["revision"]) == ({"covered": [[0, 50]]}, 1)
        err = conn.execute(
            "SELECT error FROM task_attempts WHERE task_id = %s AND attempt = 1", [tasks[1]]
        ).fetchone()["error"]
    assert "operator state changed" in err
    _, retry = wait_for(lambda: _try_lease(d, tasks[1]), 5, "the retry to be claimable")
    assert retry.attempt == 2 and retry.operator_state == {"covered": [[0, 50]]}
    assert retry.operator_state_revision == 1


def test_all_inputs_read_only_is_a_dag_error(services: Services) -> None:
    from trace_platform.dag.validate import DagInvalid

    bad = DAG.replace("- {job: windows}", "- {job: windows, triggers: false}")
    with pytest.raises(DagInvalid, match="nothing would ever start this job"):
        services.control.deploy(admin(services), bad)


def test_concurrent_first_saves_let_exactly_one_land(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No state row yet: a row lock cannot serialize these, the job's advisory lock does. The
    check is slowed down so every completion is inside the race window at once."""
    from concurrent.futures import ThreadPoolExecutor

    from trace_platform.dispatcher.core import Dispatcher

    check = Dispatcher._state_moved

    def slow_check(conn: Any, st: dict[str, Any], read_revision: int) -> bool:
        moved = check(conn, st, read_revision)
        time.sleep(0.3)
        return moved

    monkeypatch.setattr(Dispatcher, "_state_moved", staticmethod(slow_check))
    d = services.dispatcher
    tasks, _ = _src_tasks(services, 8)
    leases = [_lease(d, t) for t in tasks]

    def finish(i: int) -> str:
        lease, payload = leases[i]
        req = CompleteRequest(
            **lease,
            outcome="succeeded",
            operator_state={"covered": [[i * 50, (i + 1) * 50]]},
            operator_state_revision=payload.operator_state_revision,
        )
        return d.complete(req).status

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(finish, range(8)))
    assert sorted(statuses) == ["queued"] * 7 + ["succeeded"]
    with services.pool.connection() as conn:
        row = conn.execute("SELECT revision FROM operator_state WHERE job = 'windows'").fetchone()
    assert row["revision"] == 1
