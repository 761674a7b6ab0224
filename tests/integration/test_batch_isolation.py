"""Review: one worker's completions share a complete-batch request, so a batch the API refuses
as a whole (the gateway's body checks: a NUL anywhere, a number out of range, too deep) must not
become every item's refusal: each attempt is answered for itself, as `/internal/task-complete`
would answer it alone. An operator's bad final event fails its own task, not its neighbours'."""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest

from tests.support.batching import one_batch
from trace_platform.contract import EventIn, TaskSpec
from trace_platform.services import Services
from trace_platform.worker.client import DispatcherClient
from trace_platform.worker.wrapper import Wrapper


def _reporter(client: DispatcherClient) -> Any:
    """The wrapper's own `_report` (its refusal handling included) on a bare object."""
    stub = types.SimpleNamespace(client=client, _within_lease=Wrapper._within_lease)
    stub._report = lambda *a, **k: Wrapper._report(stub, *a, **k)  # type: ignore[arg-type]
    return stub


def _status(services: Services, task_id: Any) -> tuple[str, str | None]:
    with services.pool.connection() as conn:
        row = conn.execute(
            "SELECT status, last_error FROM task_status WHERE task_id = %s", [task_id]
        ).fetchone()
    assert row is not None
    return row["status"], row["last_error"]


@pytest.mark.parametrize("poison", ["nul", "too_deep"])
def test_a_refused_completion_does_not_fail_the_others_in_its_batch(
    client: DispatcherClient, services: Services, poison: str
) -> None:
    ids = [
        services.dispatcher.create_task(TaskSpec(job="j", operator="noop")).task_id
        for _ in range(3)
    ]
    claims = [client.claim(t, f"w{i}") for i, t in enumerate(ids)]
    # Attempt 0's operator ends "done" with something the gateway refuses in any body.
    bad: dict[str, Any]
    if poison == "nul":
        bad = {
            "final_events": [EventIn(dataset_uuid=ids[0], cursor="c", payload={"note": "a\x00b"})]
        }
    else:
        deep: dict[str, Any] = {}
        for _ in range(70):  # past the gateway's MAX_JSON_DEPTH (64)
            deep = {"d": deep}
        bad = {"operator_state": deep}
    reporter = _reporter(client)
    kwargs = [bad, {}, {}]
    # Hold the batcher busy so the three completions leave together, as eight wrappers' do.
    threads = [
        threading.Thread(target=reporter._report, args=(c, "succeeded"), kwargs=kw)
        for c, kw in zip(claims, kwargs, strict=True)
    ]
    with one_batch(client._exchange, len(threads)):
        for t in threads:
            t.start()
    for t in threads:
        t.join(30)
    got = [_status(services, t) for t in ids]
    assert got[0][0] == "failed"  # the poisoned one: refused, named
    # The two plain successes must land as succeeded (alone, each would).
    assert [s for s, _ in got[1:]] == ["succeeded", "succeeded"], got


def test_two_wakeups_of_one_task_in_a_claim_batch_do_not_refuse_the_others(
    client: DispatcherClient, services: Services
) -> None:
    """A task's wake-up delivered twice (a wake and the stranded sweep) can reach two wrappers
    of one worker at once: the batch the API refuses as a whole (a task twice) must still claim
    the other tasks, and the second wake-up of the task is the usual 409 (dropped)."""
    from trace_platform.contract import ClaimRequest
    from trace_platform.worker.client import ApiError

    a, b = (
        services.dispatcher.create_task(TaskSpec(job="j", operator="noop")).task_id
        for _ in range(2)
    )
    got = client._claim_batch(
        [ClaimRequest(task_id=t, worker_id=f"w{i}") for i, t in enumerate([a, b, b])]
    )
    assert not isinstance(got[0], BaseException) and got[0].task_id == a
    assert not isinstance(got[1], BaseException) and got[1].task_id == b
    assert isinstance(got[2], ApiError) and got[2].status == 409
