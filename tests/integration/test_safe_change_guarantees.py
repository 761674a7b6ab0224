"""Guarantees of safe change that only show when one looks at them directly (issue 39's
mutation audit: each test here failed on a one-line break of the guarantee it names, which the
broader tests in test_safe_change.py did not notice). Tasks are driven by hand through the
Dispatcher on a real Postgres, as in test_safe_change.py."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.dags import admin
from tests.support.safe_change import (
    claimable,
    cut_over_v2,
    deployed_live,
    finish,
    fire,
    pipeline,
    q,
    run_all,
    start,
    statuses,
)
from tests.support.wait import wait_for
from trace_platform.contract import (
    ClaimRequest,
    CompleteRequest,
    EventIn,
    HeartbeatRequest,
    LeaseRef,
    RangeSpec,
)
from trace_platform.dispatcher import lifecycle
from trace_platform.errors import Conflict
from trace_platform.services import Services
from trace_platform.store.tasks import postgres as pg_tasks


def where(services: Services, task_id: uuid.UUID) -> tuple[str, int]:
    row = q(services, "SELECT job, dag_version FROM task_registry WHERE task_id = %s", task_id)
    return row[0]["job"], row[0]["dag_version"]


def run_only(services: Services, keep: Callable[[str, int], bool]) -> list[tuple[str, int, str]]:
    """`run_all`, but only for the claimable tasks whose (job, dag_version) `keep` accepts."""
    ran: list[tuple[str, int, str]] = []
    while ids := [t for t in claimable(services) if keep(*where(services, t))]:
        for task_id in ids:
            ref, payload = start(services, task_id)
            finish(services, ref, payload)
            ev = payload.input_event or {}
            scope = f"{ev['range']['start']}-{ev['range']['end']}" if "range" in ev else "fire"
            ran.append((payload.job, payload.dag_version, scope))
    return ran


@pytest.fixture
def live(services: Services) -> Services:
    """Version 1 deployed, and two ranges through the whole pipeline (test_safe_change's)."""
    return deployed_live(services)


def beat(services: Services, ref: LeaseRef) -> bool:
    """The running attempt's heartbeat: is it asked to stop?"""
    return services.dispatcher.heartbeat(HeartbeatRequest(**ref.model_dump())).cancel_requested


# -- 1. rollback asks the rolled-back version's running attempts to stop ---------------------
def test_rollback_asks_the_rolled_back_versions_running_attempts_to_stop(live: Services) -> None:
    """A rollback cancels the rolled-back version's running attempts cooperatively: their next
    heartbeat says `cancel_requested`, and a retryable failure then ends the task canceled
    instead of retrying it. Work of a job both versions share goes on untouched.

    Fails if rollout.rollback's `_cancel_work(... versions=[active] ...)` cancels nothing
    (mutation: `versions=[]`): the heartbeat's cancel_requested stays false."""
    services, me = live, admin(live)
    cut_over_v2(services)
    fire(services, (300, 399))
    run_only(services, lambda job, _v: job == "source")
    running = {}
    for task_id in claimable(services):
        ref, payload = start(services, task_id)
        running[(payload.job, payload.dag_version)] = ref
    assert set(running) == {("decode", 2), ("side", 2)}
    assert not any(beat(services, ref) for ref in running.values())

    res = services.control.changes.rollback(me, "chg")
    assert (res["version"], res["rolled_back"]) == (1, 2)

    # decode differs between the versions: its version-2 attempt is asked to stop …
    assert beat(services, running[("decode", 2)]) is True
    # … and `side`, the same job in both, is not: its work lands whichever version made it.
    assert beat(services, running[("side", 2)]) is False
    decode = running[("decode", 2)]
    failed = services.dispatcher.complete(
        CompleteRequest(**decode.model_dump(), outcome="failed", error="boom", retryable=True)
    )
    assert failed.status == "canceled"  # a canceled task is not retried
    assert statuses(services, "decode", 2).count("canceled") == 1


# -- 2. cutover cancels the replaced version's queued work on rebuilt jobs -----------------
def test_cutover_cancels_the_replaced_versions_queued_work_on_rebuilt_jobs(
    live: Services,
) -> None:
    """A range that arrived mid-rebuild left a version-1 decode task queued; the cutover
    cancels it (version 2 has the range held and runs it), while version 1's `side` task, a
    job the rebuild shares, still runs.

    Fails if rollout.cutover's `_cancel_work(... versions=[...] ...)` cancels nothing
    (mutation: `versions=[]`): the queued version-1 decode task then runs to success."""
    services, me = live, admin(live)
    services.control.deploy(me, pipeline("b"))
    fire(services, (200, 299))
    assert run_only(services, lambda job, _v: job == "source") == [("source", 1, "fire")]
    # The rebuild runs to the end; version 1's decode of the new range is left waiting.
    run_only(services, lambda _job, version: version == 2)
    queued = [t for t in claimable(services) if where(services, t) == ("decode", 1)]
    assert len(queued) == 1

    (done,) = services.control.changes.auto_cutover()
    assert (done["version"], done["released"]) == (2, 1)
    status = q(services, "SELECT status FROM task_status WHERE task_id = %s", queued[0])
    assert status[0]["status"] == "canceled"
    assert done["canceled"] == 1
    with pytest.raises(Conflict):
        services.dispatcher.claim(ClaimRequest(task_id=queued[0], worker_id="w"))
    ran = run_all(services)
    assert ("decode", 1, "200-299") not in ran
    assert sorted(ran) == [("agg", 2, "200-299"), ("decode", 2, "200-299"), ("side", 1, "200-299")]
    assert statuses(services, "decode", 1).count("succeeded") == 2  # the two ranges before


# -- 3. an invalidation reaches every level downstream -------------------------------------
def input_event(services: Services, job: str) -> dict[str, Any]:
    """The input event of the job's newest task."""
    rows = q(
        services,
        "SELECT input_event FROM task_registry WHERE job = %s ORDER BY created_at DESC LIMIT 1",
        job,
    )
    return dict(rows[0]["input_event"])


def test_a_task_redoing_an_invalidated_scope_passes_the_invalidation_on(live: Services) -> None:
    """The source rewrites a range: decode gets it as an invalidation. decode's redo then
    emits its event for the range without rewriting a committed scope (nothing of its own
    says "invalidated"): agg must still get the event as an invalidation, because the task
    that emitted it was reprocessing (the `reprocessing` flag, from the task's own input).
    (test_safe_change's cascade test rewrites at every level, so each level re-derives it.)

    Fails if dispatcher/dag_tasks.tasks_for_event drops `or producer.get("reprocessing")`
    (agg's input then has no `invalidates`), or if dispatcher.sql's `reprocessing` column
    is always false."""
    services = live
    fire(services, (100, 199))  # the source rewrites a range it had committed
    assert run_only(services, lambda job, _v: job == "source") == [("source", 1, "fire")]
    decode = [t for t in claimable(services) if where(services, t)[0] == "decode"]
    assert len(decode) == 1
    ref, payload = start(services, decode[0])
    assert payload.input_event["invalidates"] is True
    (out,) = payload.outputs
    res = services.dispatcher.complete(
        CompleteRequest(
            **ref.model_dump(),
            outcome="succeeded",
            final_events=[
                EventIn(dataset_uuid=out.dataset_uuid, range=RangeSpec(start=100, end=199))
            ],
        )
    )
    assert (res.status, res.tasks_created, res.outputs_committed) == ("succeeded", 1, 0)
    agg = input_event(services, "agg")
    assert agg["range"] == {"start": 100, "end": 199}
    assert agg.get("invalidates") is True
    # A first event of a task that is not reprocessing is no invalidation.
    fire(services, (700, 799))
    run_all(services)
    assert "invalidates" not in input_event(services, "agg")


# -- 4. an event racing a change lands wholly before or wholly after it --------------------
def waiting_on_a_lock(services: Services) -> bool:
    """Does another backend of this test's database wait on a lock (as a change blocked on the
    DAG's change lock does)?"""
    rows = q(
        services,
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'",
    )
    return bool(rows)


def interleave(
    services: Services,
    monkeypatch: pytest.MonkeyPatch,
    hold_after: tuple[Any, str],
    first: Callable[[], Any],
    then: Callable[[], Any],
) -> tuple[list[BaseException], bool]:
    """Runs `first` in a thread and holds it, mid-transaction, right after it returns from
    `hold_after` (module, function name); runs `then` in another thread until it either
    finishes or waits on a lock (the one `first` holds, if any); lets `first` go on, and
    waits for both. Returns what either raised, and whether `then` waited for `first` (the
    race was run: a test that passes with `then` after `first` by chance proves nothing)."""
    module, name = hold_after
    original = getattr(module, name)
    reached, go = threading.Event(), threading.Event()

    def held(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if threading.current_thread().name == "first" and not reached.is_set():
            reached.set()
            assert go.wait(60), "the test never let the first transaction go on"
        return out

    monkeypatch.setattr(module, name, held)
    errors: list[BaseException] = []

    def run(call: Callable[[], Any]) -> Callable[[], None]:
        def body() -> None:
            try:
                call()
            except BaseException as e:
                errors.append(e)

        return body

    one = threading.Thread(target=run(first), name="first")
    two = threading.Thread(target=run(then), name="then")
    one.start()
    try:
        assert reached.wait(30), f"the first transaction never reached {name}"
        two.start()
        # `then` commits at once (nothing orders it after `first`), or waits on a lock `first`
        # holds: either way, now `first` goes on.
        wait_for(
            lambda: not two.is_alive() or waiting_on_a_lock(services),
            30,
            "the second transaction to finish or wait on a lock",
        )
        waited = two.is_alive()
    finally:
        go.set()
        one.join(60)
        if two.ident is not None:
            two.join(60)
    assert not one.is_alive() and not two.is_alive(), "a transaction is stuck"
    return errors, waited


def rebuild_inputs(services: Services, job: str) -> dict[int, int]:
    """range start -> how many live tasks of version 2 of `job` have it as input."""
    rows = q(
        services,
        "SELECT r.input_event -> 'range' ->> 'start' AS start, count(*) AS n "
        "FROM task_registry r JOIN task_status s USING (task_id, start_day) "
        "WHERE r.job = %s AND r.dag_version = 2 AND s.status <> 'canceled' GROUP BY 1",
        job,
    )
    return {int(r["start"]): r["n"] for r in rows}


def test_an_event_fanned_out_while_a_deploy_commits_reaches_the_rebuild_once(
    live: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving that loses an event, made deterministic: a source task's completion has
    stored its event and computed the event's subscribers (version 2 does not exist yet, so no
    held task for it), and is held there, uncommitted, while a deploy of version 2 runs. The
    deploy's replay of the source's history must not miss that event: the DAG's change lock,
    which fan-out holds shared (lifecycle's `lock_task_dag_shared`, and dag_tasks's
    `lock_dags_shared`) and a deploy exclusive, makes the deploy wait for the completion to
    commit, so it replays the range. (test_safe_change's racing test runs the two at random
    and rarely hits this window.)

    Fails if both shared locks are removed (mutation: `tx.lock_task_dag_shared(req.task_id)`
    in lifecycle.Lifecycle._complete_full and `DagTaskStore(conn).lock_dags_shared(...)` in
    dag_tasks.tasks_for_event deleted): the deploy commits without waiting, and version 2's
    decode never gets range 200-299 ({0: 1, 100: 1} != {0: 1, 100: 1, 200: 1})."""
    services, me = live, admin(live)
    fire(services, (200, 299))
    (source,) = claimable(services)
    ref, payload = start(services, source)
    errors, waited = interleave(
        services,
        monkeypatch,
        (pg_tasks, "tasks_for_event"),
        lambda: finish(services, ref, payload),
        lambda: services.control.deploy(me, pipeline("b")),
    )
    assert not errors, errors
    run_all(services)
    assert rebuild_inputs(services, "decode") == {0: 1, 100: 1, 200: 1}
    assert waited, "the deploy did not wait for the completion: the race was not run"


READER = """
name: rd
jobs:
  count:
    operator: noop
    config: {{mode: {mode}}}
    inputs: [{{from: {{dataset: chg_side}}}}]
    outputs: [{{backend: parquet}}]
"""


def test_an_event_fanned_out_to_another_dag_while_it_deploys_reaches_its_rebuild_once(
    live: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race across DAGs: `rd` reads `chg_side`, which chg publishes. A chg task's
    completion holds only chg's change lock through its own task (`lock_task_dag_shared`);
    what orders it with a deploy of `rd` is the shared lock fan-out takes on every DAG
    subscribing to the event's dataset (`lock_dags_shared`).

    Fails if dag_tasks.tasks_for_event's `DagTaskStore(conn).lock_dags_shared(...)` is
    deleted (alone): rd's version 2 never gets range 200-299."""
    services, me = live, admin(live)
    services.control.deploy(me, READER.format(mode="a"))
    assert sorted(run_all(services)) == [("count", 1, "0-99"), ("count", 1, "100-199")]
    fire(services, (200, 299))
    assert run_only(services, lambda job, _v: job == "source") == [("source", 1, "fire")]
    (side,) = [t for t in claimable(services) if where(services, t)[0] == "side"]
    ref, payload = start(services, side)
    errors, waited = interleave(
        services,
        monkeypatch,
        (pg_tasks, "tasks_for_event"),
        lambda: finish(services, ref, payload),
        lambda: services.control.deploy(me, READER.format(mode="b")),
    )
    assert not errors, errors
    assert services.control.show_dag(me, "rd")["building_version"] == 2
    run_all(services)
    assert rebuild_inputs(services, "count") == {0: 1, 100: 1, 200: 1}
    assert waited, "rd's deploy did not wait for the completion: the race was not run"


def test_a_completion_and_a_rollback_take_their_locks_in_one_order(
    live: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A completion that fans out takes its DAG's change lock (shared) before its task's status
    row, the order a rollback takes them in (change lock exclusive, then the rows it cancels).
    Here the completion of a running version-2 decode holds its status row while a rollback
    that cancels it runs: both must finish, one after the other, with no deadlock.

    Fails if lifecycle.Lifecycle._complete_full's `tx.lock_task_dag_shared(req.task_id)` is
    deleted (alone): the completion holds the row and then waits for the change lock in
    fan-out while the rollback holds that and waits for the row: Postgres aborts one
    (DeadlockDetected)."""
    services, me = live, admin(live)
    cut_over_v2(services)
    fire(services, (300, 399))
    run_only(services, lambda job, _v: job == "source")
    (decode,) = [t for t in claimable(services) if where(services, t) == ("decode", 2)]
    ref, payload = start(services, decode)
    done: dict[str, Any] = {}
    errors, waited = interleave(
        services,
        monkeypatch,
        (lifecycle, "fenced"),
        lambda: done.update(completed=finish(services, ref, payload)),
        lambda: done.update(rollback=services.control.changes.rollback(me, "chg")),
    )
    assert not errors, errors
    assert done["completed"] == "succeeded"  # it committed first: the rollback waited for it
    assert (done["rollback"]["version"], done["rollback"]["rolled_back"]) == (1, 2)
    assert waited, "the rollback did not wait for the completion: the race was not run"
