"""The Dispatcher task lifecycle against a real Postgres."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from tests.support.invariants import assert_invariants, expire_lease
from trace_platform.contract import (
    Claim,
    ClaimRequest,
    CompleteRequest,
    CompleteResponse,
    DatasetRef,
    EventIn,
    EventsRequest,
    HeartbeatRequest,
    LeaseRef,
    OutputCommit,
    RangeSpec,
    TaskSpec,
)
from trace_platform.errors import Conflict, Forbidden, NotFound
from trace_platform.services import Services

Q = "tasks"


def spec(**kw: Any) -> TaskSpec:
    return TaskSpec(**{"job": "j", "operator": "noop", **kw})


def claim(services: Services, task_id: uuid.UUID, worker: str = "w1") -> Claim:
    return services.dispatcher.claim(ClaimRequest(task_id=task_id, worker_id=worker))


def ref(c: Claim) -> dict[str, Any]:
    return {"task_id": c.task_id, "attempt": c.attempt, "lease_token": c.lease_token}


def complete(
    services: Services, c: Claim, outcome: str = "succeeded", **kw: Any
) -> CompleteResponse:
    return services.dispatcher.complete(CompleteRequest(**ref(c), outcome=outcome, **kw))


def q(services: Services, sql: str, *args: Any) -> list[dict[str, Any]]:
    with services.pool.connection() as conn:
        return conn.execute(sql, args).fetchall()


def ev(cursor: str, dataset: uuid.UUID | None = None) -> EventIn:
    return EventIn(dataset_uuid=dataset or uuid.UUID(int=7), cursor=cursor)


def test_create_writes_intent_and_outbox_never_the_queue(services: Services) -> None:
    ref_ = services.dispatcher.create_task(spec())
    assert ref_.status == "queued"
    assert q(services, "SELECT count(*) AS n FROM queue_messages")[0]["n"] == 0
    outbox = q(services, "SELECT queue_name, payload FROM outbox WHERE sent_at IS NULL")
    # The wake-up is ARCHITECTURE's thin shape: no partition hint (the status row has it).
    assert outbox == [
        {"queue_name": Q, "payload": {"kind": "task_wakeup", "task_id": str(ref_.task_id)}}
    ]
    assert services.publisher.drain() == 1
    msgs = services.driver.receive(Q, 10, 30)
    assert [x.payload["task_id"] for x in msgs] == [str(ref_.task_id)]


def test_registry_row_is_partitioned_by_start_day(services: Services) -> None:
    r = services.dispatcher.create_task(spec())
    rows = q(
        services,
        "SELECT tableoid::regclass::text AS part, start_day FROM task_registry WHERE task_id = %s",
        r.task_id,
    )
    assert rows[0]["start_day"] == r.start_day
    assert rows[0]["part"].startswith("task_registry_20")


def test_claim_increments_attempt_and_is_exclusive(services: Services) -> None:
    r = services.dispatcher.create_task(spec())
    c = claim(services, r.task_id)
    assert c.attempt == 1
    with pytest.raises(Conflict) as e:
        claim(services, r.task_id, "w2")
    assert e.value.code == "not_claimable"
    with pytest.raises(NotFound):
        claim(services, uuid.uuid4())


def test_fetch_payload(services: Services) -> None:
    parent = uuid.uuid4()
    r = services.dispatcher.create_task(
        spec(
            config={"a": 1},
            parent_task_id=parent,
            input_event={"cursor": "5"},
            input_versions=[
                DatasetRef(dataset_uuid=uuid.UUID(int=1), dataset_version=uuid.UUID(int=2))
            ],
        )
    )
    c = claim(services, r.task_id)
    p = services.dispatcher.fetch(LeaseRef(**ref(c)))
    assert (p.status, p.attempt, p.config, p.parent_task_id) == ("running", 1, {"a": 1}, parent)
    assert p.inputs[0].dataset_version == uuid.UUID(int=2)
    assert p.idempotency.producer_task_id == r.task_id
    assert p.start_day == r.start_day and p.deadline_at is not None
    with pytest.raises(Conflict) as e:
        services.dispatcher.fetch(LeaseRef(**{**ref(c), "lease_token": uuid.uuid4()}))
    assert e.value.code == "wrong_lease"


def test_claim_carries_the_fetch_payload(services: Services) -> None:
    """Asked for it, the claim answers what a fetch would, read under the lease it took; not
    asked, it carries none (the core callers' claim stays one statement)."""
    r = services.dispatcher.create_task(spec(config={"a": 1}))
    c = services.dispatcher.claim(ClaimRequest(task_id=r.task_id, worker_id="w"), payload=True)
    assert c.task is not None
    assert c.task == services.dispatcher.fetch(LeaseRef(**ref(c)))
    assert (c.task.status, c.task.attempt, c.task.config) == ("running", c.attempt, {"a": 1})
    assert c.task.lease_until == c.lease_until
    plain = claim(services, services.dispatcher.create_task(spec()).task_id)
    assert plain.task is None


def test_success_and_idempotent_report(services: Services) -> None:
    r = services.dispatcher.create_task(spec())
    c = claim(services, r.task_id)
    assert complete(services, c).status == "succeeded"
    assert complete(services, c).status == "succeeded"  # the same report again
    with pytest.raises(Conflict) as e:
        complete(services, c, "failed", error="late")
    assert e.value.code == "task_finished"
    view = services.dispatcher.get_task(r.task_id)
    assert view.status == "succeeded" and [a.outcome for a in view.attempts] == ["succeeded"]


def test_failure_retries_with_backoff_until_max_attempts(services: Services) -> None:
    r = services.dispatcher.create_task(
        spec(max_attempts=2, retry_backoff_seconds=0.3, retry_backoff_max_seconds=0.3)
    )
    services.publisher.drain()
    c1 = claim(services, r.task_id)
    res = complete(services, c1, "failed", error="boom")
    assert res.status == "queued" and res.next_attempt_at is not None
    with pytest.raises(Conflict, match="backing off"):
        claim(services, r.task_id)
    delayed = q(services, "SELECT delay_seconds FROM outbox WHERE sent_at IS NULL")
    assert [d["delay_seconds"] for d in delayed] == [1]  # ceil of a jittered 0.15-0.3 s
    time.sleep(0.35)
    c2 = claim(services, r.task_id)
    assert c2.attempt == 2
    res = complete(services, c2, "failed", error="boom again")
    assert res.status == "failed"
    view = services.dispatcher.get_task(r.task_id)
    assert view.last_error == "boom again"
    assert [a.outcome for a in view.attempts] == ["failed", "failed"]


def test_permanent_failure_does_not_retry(services: Services) -> None:
    r = services.dispatcher.create_task(spec(max_attempts=5))
    c = claim(services, r.task_id)
    assert complete(services, c, "failed", error="bad config", retryable=False).status == "failed"


def test_backoff_is_capped_and_jittered() -> None:
    import random

    from trace_platform.dispatcher.lifecycle import backoff_seconds

    rng = random.Random(1)
    for attempt in range(1, 30):
        d = backoff_seconds(attempt, 1.0, 60.0, rng)
        full = min(60.0, 2 ** (attempt - 1))
        assert full / 2 <= d <= full
    assert len({round(backoff_seconds(3, 1.0, 60.0, rng), 6) for _ in range(20)}) > 1


def test_reaper_expires_lost_lease_and_fences_old_attempt(services: Services) -> None:
    r = services.dispatcher.create_task(spec(max_attempts=3))
    c1 = claim(services, r.task_id)
    # No heartbeat: let the 2 s lease run out.
    expire_lease(services, r.task_id)
    assert services.dispatcher.reap() == 1
    view = services.dispatcher.get_task(r.task_id)
    assert view.status == "queued" and view.attempts[0].outcome == "lease_expired"
    with pytest.raises(Conflict) as e:
        services.dispatcher.heartbeat(HeartbeatRequest(**ref(c1)))
    assert e.value.code == "lease_lost"
    c2 = claim(services, r.task_id)  # at once: a lost lease is the worker's failure, no backoff
    assert c2.attempt == 2
    # Attempt 1 finishes late, after attempt 2 started: rejected.
    with pytest.raises(Conflict) as e:
        complete(services, c1, final_events=[ev("x")])
    assert e.value.code == "stale_attempt"
    with pytest.raises(Conflict):
        services.dispatcher.events(EventsRequest(**ref(c1), events=[ev("y")]))
    assert q(services, "SELECT count(*) AS n FROM events")[0]["n"] == 0  # nothing leaked in
    assert complete(services, c2).status == "succeeded"
    assert_invariants(services)


def test_default_lease_is_three_heartbeats() -> None:
    from trace_platform.config import Settings

    s = Settings()
    assert s.lease_seconds == 3 * s.heartbeat_seconds


def test_late_completion_of_current_attempt_is_accepted(services: Services) -> None:
    r = services.dispatcher.create_task(spec(max_attempts=3))
    c1 = claim(services, r.task_id)
    expire_lease(services, r.task_id)
    services.dispatcher.reap()
    # Reaped, re-queued, but no newer attempt has started: attempt 1's success still counts.
    assert complete(services, c1).status == "succeeded"
    time.sleep(0.25)
    services.publisher.drain()
    with pytest.raises(Conflict):  # the retry's wake-up finds nothing to claim
        claim(services, r.task_id)
    assert_invariants(services)


def test_late_success_after_final_reap_is_accepted(services: Services) -> None:
    r = services.dispatcher.create_task(spec(max_attempts=1))
    c1 = claim(services, r.task_id)
    expire_lease(services, r.task_id)
    services.dispatcher.reap()
    assert services.dispatcher.get_task(r.task_id).status == "failed"
    assert complete(services, c1).status == "succeeded"


def test_timeout_is_reaped_even_with_heartbeats(services: Services) -> None:
    r = services.dispatcher.create_task(spec(timeout_seconds=1, max_attempts=1))
    c = claim(services, r.task_id)
    time.sleep(1.1)
    services.dispatcher.heartbeat(HeartbeatRequest(**ref(c)))  # the lease is fine …
    assert services.dispatcher.reap() == 1  # … but the deadline is not
    view = services.dispatcher.get_task(r.task_id)
    assert view.status == "failed" and view.attempts[0].outcome == "timed_out"
    assert "timeout" in (view.last_error or "")


def test_heartbeat_extends_lease(services: Services) -> None:
    r = services.dispatcher.create_task(spec())
    c = claim(services, r.task_id)
    time.sleep(0.05)
    hb = services.dispatcher.heartbeat(HeartbeatRequest(**ref(c)))
    assert hb.lease_until > c.lease_until and not hb.cancel_requested  # moved on, not kept
    with pytest.raises(Conflict) as e:
        services.dispatcher.heartbeat(HeartbeatRequest(**{**ref(c), "attempt": 2}))
    assert e.value.code == "stale_attempt"


def test_heartbeat_progress_is_stored_until_the_next_attempt(services: Services) -> None:
    r = services.dispatcher.create_task(spec(max_attempts=2))
    c = claim(services, r.task_id)

    def stored() -> Any:
        return q(services, "SELECT progress FROM task_status WHERE task_id = %s", r.task_id)[0][
            "progress"
        ]

    assert stored() is None
    services.dispatcher.heartbeat(HeartbeatRequest(**ref(c), progress={"done": 0.5, "rows": 7}))
    assert stored() == {"done": 0.5, "rows": 7}
    services.dispatcher.heartbeat(HeartbeatRequest(**ref(c)))  # none reported: the last stays
    assert stored() == {"done": 0.5, "rows": 7}
    with pytest.raises(ValueError, match="progress is larger than 4096 bytes"):
        HeartbeatRequest(**ref(c), progress={"x": "y" * 5000})
    complete(services, c, "failed", retryable=True)
    with services.pool.connection() as conn:  # skip the retry's backoff
        conn.execute(
            "UPDATE task_status SET next_attempt_at = now() WHERE task_id = %s", [r.task_id]
        )
    claim(services, r.task_id)  # a new attempt reports its own progress
    assert stored() is None


def test_cancel_queued_and_running(services: Services) -> None:
    queued = services.dispatcher.create_task(spec())
    assert services.dispatcher.cancel(queued.task_id).status == "canceled"
    with pytest.raises(Conflict):
        claim(services, queued.task_id)
    assert services.dispatcher.cancel(queued.task_id).status == "canceled"  # idempotent

    running = services.dispatcher.create_task(spec())
    c = claim(services, running.task_id)
    res = services.dispatcher.cancel(running.task_id)
    assert (res.status, res.cancel_requested) == ("running", True)
    assert services.dispatcher.heartbeat(HeartbeatRequest(**ref(c))).cancel_requested
    assert services.dispatcher.fetch(LeaseRef(**ref(c))).status == "canceled"
    assert complete(services, c, "canceled").status == "canceled"

    done = services.dispatcher.create_task(spec())
    complete(services, claim(services, done.task_id))
    with pytest.raises(Conflict, match="already succeeded"):
        services.dispatcher.cancel(done.task_id)
    with pytest.raises(NotFound):
        services.dispatcher.cancel(uuid.uuid4())


def test_canceled_running_task_whose_lease_expires_is_not_retried(services: Services) -> None:
    r = services.dispatcher.create_task(spec(max_attempts=5))
    claim(services, r.task_id)
    services.dispatcher.cancel(r.task_id)
    expire_lease(services, r.task_id)
    services.dispatcher.reap()
    assert services.dispatcher.get_task(r.task_id).status == "canceled"


def test_events_are_deduplicated_and_final_events_atomic(services: Services) -> None:
    outputs = [DatasetRef(dataset_uuid=uuid.UUID(int=i)) for i in (7, 8)]
    r = services.dispatcher.create_task(spec(outputs=outputs))
    c = claim(services, r.task_id)
    d = services.dispatcher
    first = d.events(EventsRequest(**ref(c), events=[ev("1"), ev("2")]))
    again = d.events(EventsRequest(**ref(c), events=[ev("2"), ev("3")]))
    assert (first.accepted, first.duplicates, again.accepted, again.duplicates) == (2, 0, 1, 1)
    other = uuid.UUID(int=8)
    res = complete(
        services,
        c,
        final_events=[
            ev("3"),
            ev("3", other),
            EventIn(dataset_uuid=other, range=RangeSpec(start=1, end=9)),
        ],
    )
    assert (res.events_accepted, res.events_duplicate) == (2, 1)
    keys = {(e["dataset_uuid"].int, e["dedupe_key"]) for e in q(services, "SELECT * FROM events")}
    assert keys == {
        (7, "cursor:1"),
        (7, "cursor:2"),
        (7, "cursor:3"),
        (8, "cursor:3"),
        (8, "range:1-9"),
    }
    assert d.get_task(r.task_id).events == 5


def test_event_identity_validation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        EventIn(dataset_uuid=uuid.uuid4())
    with pytest.raises(ValueError, match="exactly one"):
        EventIn(dataset_uuid=uuid.uuid4(), cursor="1", partition_key="p")
    with pytest.raises(ValueError, match="before start"):
        RangeSpec(start=5, end=1)


def test_partitions_created_ahead(services: Services) -> None:
    from trace_platform.dispatcher.reaper import ensure_partitions

    parts = q(
        services,
        """SELECT inhrelid::regclass::text AS p FROM pg_inherits
                           WHERE inhparent = 'task_registry'::regclass""",
    )
    assert len(parts) >= 3  # last month, this month, and ahead
    assert ensure_partitions(services.dispatcher) == 0  # idempotent


def test_concurrent_reapers_reap_each_attempt_once(services: Services) -> None:
    import threading

    ids = [services.dispatcher.create_task(spec(max_attempts=3)).task_id for _ in range(60)]
    for t in ids:
        claim(services, t)
    with services.pool.connection() as conn:
        conn.execute("UPDATE task_status SET lease_until = now() - interval '1 s'")
    services.publisher.drain()
    reaped: list[int] = []
    threads = [
        threading.Thread(target=lambda: reaped.append(services.dispatcher.reap(limit=7)))
        for _ in range(12)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    while n := services.dispatcher.reap():
        reaped.append(n)
    assert sum(reaped) == 60
    outcomes = q(services, "SELECT outcome, count(*) AS n FROM task_attempts GROUP BY 1")
    assert outcomes == [{"outcome": "lease_expired", "n": 60}]
    assert q(services, "SELECT count(*) AS n FROM outbox WHERE sent_at IS NULL")[0]["n"] == 60


def test_stranded_queued_task_gets_a_fresh_wakeup(services: Services) -> None:
    r = services.dispatcher.create_task(spec())
    services.publisher.drain()
    msg = services.driver.receive(Q, 1, 30)[0]
    services.driver.nack(Q, msg.receipt, "lost")  # pretend the wake-up went astray
    with services.pool.connection() as conn:
        conn.execute("DELETE FROM queue_messages")
        conn.execute("UPDATE task_status SET updated_at = now() - interval '10 min'")
    assert services.dispatcher.rewake(after_seconds=300) == 1
    assert services.dispatcher.rewake(after_seconds=300) == 0  # touched: not again at once
    services.publisher.drain()
    assert [m_.payload["task_id"] for m_ in services.driver.receive(Q, 5, 30)] == [str(r.task_id)]


def test_a_task_speaks_only_for_its_own_outputs(services: Services) -> None:
    """No outputs: nothing may be emitted or committed; a foreign dataset: refused (403), and
    nothing of the call is stored (the first, legal event in the same call included)."""
    d = services.dispatcher
    for outputs in ([], [DatasetRef(dataset_uuid=uuid.UUID(int=7))]):
        c = claim(services, d.create_task(spec(outputs=outputs)).task_id)
        foreign = ev("1", uuid.UUID(int=99))
        legal = [ev("0")] if outputs else []
        with pytest.raises(Forbidden, match="does not produce"):
            d.events(EventsRequest(**ref(c), events=[*legal, foreign]))
        with pytest.raises(Forbidden, match="does not produce"):
            complete(services, c, final_events=[foreign])
        with pytest.raises(Forbidden, match="does not produce"):
            complete(
                services,
                c,
                outputs=[
                    OutputCommit(
                        dataset_uuid=uuid.UUID(int=99),
                        dataset_version=uuid.uuid4(),
                        partition_key="all",
                    )
                ],
            )
        assert q(services, "SELECT * FROM events") == []
        assert q(services, "SELECT * FROM dataset_commits") == []
        assert d.get_task(c.task_id).status == "running"


@pytest.mark.parametrize("path", ["reaper", "completion"])
def test_reaper_does_not_count_state_conflicts_as_tries(services: Services, path: str) -> None:
    """An attempt lost to an operator-state race costs no retry budget, on the reaper's path as
    on the completion path."""
    d = services.dispatcher
    r = d.create_task(spec(max_attempts=2))
    claim(services, r.task_id)
    with services.pool.connection() as conn:  # attempt 1 lost a state race, then was retried
        conn.execute(
            "UPDATE task_attempts SET outcome = 'state_conflict', finished_at = now() "
            "WHERE task_id = %s AND attempt = 1",
            (r.task_id,),
        )
        conn.execute(
            "UPDATE task_status SET status = 'queued', lease_until = NULL, "
            "next_attempt_at = now() WHERE task_id = %s",
            (r.task_id,),
        )
    c2 = claim(services, r.task_id)
    assert c2.attempt == 2
    if path == "reaper":
        expire_lease(services, r.task_id)
        d.reap()
    else:
        assert complete(services, c2, "failed", retryable=True, error="boom").status == "queued"
    assert d.get_task(r.task_id).status == "queued"  # one real try of two: retried


def test_the_invariants_see_wakeups_a_batch_lease_holds(services: Services) -> None:
    """A wake-up held in a batch lease (a receive of 16 or more) keeps its task from being
    lost; acked with its task still queued, the task is lost."""
    ids = [services.dispatcher.create_task(spec()).task_id for _ in range(20)]
    services.publisher.drain()
    got = services.driver.receive(Q, 20, 60)
    assert len(got) == 20
    with services.pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM queue_leases").fetchone() == {"n": 1}
    assert_invariants(services)
    gone = [m for m in got if m.payload["task_id"] in {str(i) for i in ids[:3]}]
    assert services.driver.ack_many(Q, [m.receipt for m in gone]) == 3
    with pytest.raises(AssertionError, match="lost") as lost:
        assert_invariants(services)
    assert all(str(i) in str(lost.value) for i in ids[:3])
    assert not any(str(i) in str(lost.value) for i in ids[3:])
    for task_id in ids[:3]:
        services.dispatcher.cancel(task_id)
    assert_invariants(services)


def test_the_invariants_catch_a_lost_task_and_an_orphan_wakeup(services: Services) -> None:
    """The checker itself can fail: a queued task whose wake-up vanished is lost, and a
    wake-up for a task that does not exist is an orphan."""
    r = services.dispatcher.create_task(spec())
    assert_invariants(services)  # its wake-up is in the queue: fine
    with services.pool.connection() as conn:
        conn.execute(
            "DELETE FROM queue_messages WHERE payload ->> 'task_id' = %s", [str(r.task_id)]
        )
    with pytest.raises(AssertionError, match="lost"):
        assert_invariants(services)
    services.dispatcher.cancel(r.task_id)
    assert_invariants(services)
    with services.pool.connection() as conn:
        conn.execute(
            "INSERT INTO queue_messages (queue_name, payload) VALUES (%s, %s)",
            [Q, json.dumps({"kind": "task_wakeup", "task_id": str(uuid.uuid4())})],
        )
    with pytest.raises(AssertionError, match="do not exist"):
        assert_invariants(services)
