"""Review: the batch paths against a revoked cross-DAG reader and an expired, re-claimed lease."""

from __future__ import annotations

import time

from tests.integration.test_authorization import alice_and_her_reader, set_roles_of
from trace_platform.contract import Claim, ClaimRequest, CompleteRequest, TaskSpec
from trace_platform.errors import Conflict, Forbidden
from trace_platform.services import Services


def test_claim_many_refuses_a_revoked_reader_alone(services: Services) -> None:
    d = services.dispatcher
    reader_id = alice_and_her_reader(services)()
    set_roles_of(services, "bob", [])
    plain = d.create_task(TaskSpec(job="j", operator="noop")).task_id
    got = d.claim_many(
        [
            ClaimRequest(task_id=reader_id, worker_id="w1"),
            ClaimRequest(task_id=plain, worker_id="w2"),
        ]
    )
    assert isinstance(got[0], Forbidden), got[0]
    assert isinstance(got[1], Claim) and got[1].attempt == 1
    view = d.get_task(reader_id)
    assert view.status == "failed" and view.attempts == []


def test_complete_many_after_the_lease_expired_and_another_worker_reclaimed(
    services: Services,
) -> None:
    d = services.dispatcher
    a, b = (d.create_task(TaskSpec(job="j", operator="noop")).task_id for _ in range(2))
    first = d.claim_many(
        [ClaimRequest(task_id=a, worker_id="w1"), ClaimRequest(task_id=b, worker_id="w1")]
    )
    assert all(isinstance(c, Claim) for c in first)
    time.sleep(services.settings.lease_seconds + 0.3)
    assert d.reap() == 2
    second = d.claim_many(
        [ClaimRequest(task_id=a, worker_id="w2"), ClaimRequest(task_id=b, worker_id="w2")]
    )
    assert [c.attempt for c in second] == [2, 2]  # type: ignore[union-attr]
    old = [
        CompleteRequest(
            task_id=c.task_id, attempt=c.attempt, lease_token=c.lease_token, outcome="succeeded"
        )
        for c in first
    ]  # type: ignore[union-attr]
    # attempt 1 with its own token (stale), attempt 2 with attempt 1's token (wrong lease)
    forged = CompleteRequest(
        task_id=b,
        attempt=2,
        lease_token=first[1].lease_token,  # type: ignore[union-attr]
        outcome="succeeded",
    )
    got = d.complete_many([old[0], forged])
    assert isinstance(got[0], Conflict) and got[0].code == "stale_attempt"
    assert isinstance(got[1], Conflict) and got[1].code == "wrong_lease"
    assert [d.get_task(t).status for t in (a, b)] == ["running", "running"]
    assert [x.outcome for x in d.get_task(a).attempts] == ["lease_expired", "running"]
