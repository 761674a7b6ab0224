"""The Delivery Service against a real Postgres and a real HTTP receiver on 127.0.0.1 that
verifies every request with the `standardwebhooks` package (issue 40): deliveries made by the
real routing path (alerts landed by the sink, routed, landed again) are sent signed, with their
idempotency keys, each key always with its first body, through a rollback of the producing
DAG, never when suppressed, and never to a redirect or an internal address unless an admin
allowed that destination. A receiver down for 30 s then back: tests/chaos/test_delivery_outage.py."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.alerts import (
    add_delivery,
    alert,
    dag,
    deliveries,
    drain,
    publish,
    publish_alerts,
    route,
    route_tasks,
)
from tests.support.dags import admin, user
from tests.support.queue_outage import AwayFirst
from tests.support.receiver import Receiver
from tests.support.wait import wait_for
from trace_platform.db.embedded import free_port
from trace_platform.delivery import signing
from trace_platform.delivery.control import DeliveryControl
from trace_platform.delivery.sender import retry_after
from trace_platform.delivery.service import DeliveryService, backoff
from trace_platform.delivery.work import QUEUE
from trace_platform.errors import Forbidden, NotFound
from trace_platform.identity import Actor
from trace_platform.identity.vault import vault_for
from trace_platform.layout import buffer_prefix
from trace_platform.objectstore import make_store
from trace_platform.queue.payloads import Delivery, encode
from trace_platform.services import Services
from trace_platform.store.deliveries import DeliveryStore

FAST = {
    "delivery_backoff_seconds": 0.05,
    "delivery_backoff_max_seconds": 0.25,
    "delivery_poll_seconds": 0.05,
    "delivery_timeout_seconds": 2.0,
    "delivery_lease_seconds": 5.0,
}


def _control(s: Services) -> DeliveryControl:
    return DeliveryControl(s.pool, vault_for(s.settings))


def _service(s: Services, **kw: Any) -> DeliveryService:
    settings = s.settings.model_copy(update={**FAST, **kw})
    return DeliveryService(s.pool, s.driver, vault_for(settings), settings)


@pytest.fixture
def running(services: Services) -> Iterator[Callable[..., None]]:
    """Starts Delivery Services in threads (as many as asked); all stopped at the end."""
    stop = threading.Event()
    threads: list[threading.Thread] = []
    made: list[DeliveryService] = []

    def start(n: int = 1, **kw: Any) -> None:
        for _ in range(n):
            svc = _service(services, **kw)
            made.append(svc)
            t = threading.Thread(target=svc.serve, args=(stop,), daemon=True)
            t.start()
            threads.append(t)

    yield start
    stop.set()
    for _ in threads:  # a service waiting on the queue for work sees the stop at once
        services.driver.publish(QUEUE, encode(Delivery(delivery_id=uuid.uuid4())))
    for t in threads:
        t.join(10)
    for svc in made:
        svc.close()


def _deliver(s: Services, tmp: Path, alerts: list[dict[str, Any]], name: str = "watch") -> None:
    """Alerts landed, routed, and their deliveries made (as the stack does)."""
    publish_alerts(s, alerts, name)
    for t in route_tasks(s):
        route(s, tmp / str(t), t)


def _by_status(s: Services) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in deliveries(s).values():
        out[r["status"]] = out.get(r["status"], 0) + 1
    return out


def _attempts(s: Services) -> list[dict[str, Any]]:
    with s.pool.connection() as conn:
        return conn.execute("SELECT * FROM delivery_attempts ORDER BY finished_at").fetchall()


def test_a_key_routed_again_with_another_body_keeps_and_sends_its_first_body(
    services: Services, tmp_path: Path
) -> None:
    """The same idempotency key always carries the same body: the one stored when the key was
    first made. The routing run again, and a batch of the same key with a changed payload
    (landed: the sink refuses nothing of it), change nothing stored, and the receiver gets the
    first body."""
    s, me = services, admin(services)
    s.control.deploy(me, dag())
    recv = Receiver(free_port(), None).start()
    try:
        recv.secret = _control(s).add_destination(me, "ops", recv.url, allow_private=True)
        publish_alerts(s, [alert("a", "warning", timedelta(minutes=1))])
        (task,) = route_tasks(s)
        c = route(s, tmp_path / "a", task)
        (first,) = deliveries(s).values()
        route(s, tmp_path / "b", task, c)  # re-run: every alert routed again
        b = json.loads(first["body"])
        changed = {
            "idempotency_key": b["idempotency_key"],
            "destination": b["destination"],
            "status": "pending",
            "alert_dag_id": b["dag_id"],
            "alert_job": b["job"],
            "rule": b["rule"],
            "dedupe_key": b["dedupe_key"],
            "severity": "critical",
            "event_time": b["event_time"],
            "payload": {"changed": True},
            "reason": None,
        }
        key = f"{buffer_prefix(me.org_id, c.task_id, c.attempt)}again.jsonl"
        make_store(s.settings).put(key, (json.dumps(changed) + "\n").encode())
        publish(s, c, "alert_deliveries", key)
        drain(s)
        with s.pool.connection() as conn:
            landed = conn.execute(
                "SELECT status FROM buffer_records WHERE location = %s", (key,)
            ).fetchone()
        assert landed is not None and landed["status"] == "loaded"
        (stored,) = deliveries(s).values()
        assert (stored["delivery_id"], stored["body"]) == (first["delivery_id"], first["body"])
        _service(s).drain()
        (arrived,) = recv.wait(lambda a: len(a) >= 1)
    finally:
        recv.stop()
    assert arrived.verified and arrived.webhook_id == b["idempotency_key"]
    assert arrived.body == first["body"] and "changed" not in arrived.body
    assert len(recv.arrivals) == 1


def test_a_forged_signature_is_rejected_by_a_receiver_using_the_library(
    services: Services, tmp_path: Path
) -> None:
    s, me = services, admin(services)
    s.control.deploy(me, dag())
    recv = Receiver(free_port(), signing.new_secret()).start()
    try:
        body = '{"type":"alert"}'
        forged = signing.headers(signing.new_secret(), "alert_x", body)  # another secret
        r = httpx.post(recv.url, content=body, headers=forged)
        assert r.status_code == 401 and not recv.arrivals[-1].verified
        good = signing.headers(recv.secret or "", "alert_x", body)
        assert httpx.post(recv.url, content=body, headers=good).status_code == 204
        tampered = httpx.post(recv.url, content=body + " ", headers=good)
        assert tampered.status_code == 401
        # A destination whose secret is not the receiver's: refused by it, failed for good.
        _control(s).add_destination(me, "ops", recv.url, allow_private=True)
        _deliver(s, tmp_path, [alert("a", "warning", timedelta(minutes=1))])
        _service(s).drain()
    finally:
        recv.stop()
    (d,) = deliveries(s).values()
    assert d["status"] == "failed" and d["reason"].startswith("HTTP 401")


def test_deliveries_keep_flowing_through_a_rollback_and_a_pause_of_the_producing_dag(
    services: Services, tmp_path: Path, running: Callable[..., None]
) -> None:
    s, me = services, admin(services)
    s.control.deploy(me, dag())
    s.control.deploy(me, dag() + "    timeout_seconds: 600\n")  # version 2
    recv = Receiver(free_port(), None).start()
    recv.secret = _control(s).add_destination(me, "ops", recv.url, allow_private=True)
    try:
        _deliver(s, tmp_path, [alert(f"a{i}", "warning", timedelta(minutes=1)) for i in range(4)])
        res = s.control.changes.rollback(me, "watch")
        assert (res["version"], res["rolled_back"]) == (1, 2)
        s.control.changes.set_paused(me, "watch", True)  # and paused: deliveries still go
        running(1)
        got = recv.wait(lambda a: len({x.webhook_id for x in a if x.verified}) == 4)
        # The receiver has the fourth before its sender has recorded the answer.
        wait_for(lambda: _by_status(s) == {"delivered": 4}, 30, "all four recorded delivered")
    finally:
        recv.stop()
    assert all(a.verified for a in got)


def test_redirects_and_internal_addresses_are_refused_unless_allowed(
    services: Services, tmp_path: Path
) -> None:
    s, me = services, admin(services)
    s.control.deploy(me, dag(destinations=("hop", "local", "private")))
    target = Receiver(free_port(), signing.new_secret()).start()
    hop = Receiver(free_port(), None)
    hop.answer = lambda _a: (302, {"location": target.url})
    hop.start()
    ctl = _control(s)
    try:
        hop.secret = ctl.add_destination(me, "hop", hop.url, allow_private=True)
        local = Receiver(free_port(), None).start()
        local.secret = ctl.add_destination(me, "local", f"http://localhost:{local.port}/hook")
        ctl.add_destination(me, "private", "http://10.255.255.1:9/hook")
        _deliver(s, tmp_path, [alert("a", "warning", timedelta(minutes=1))])
        _service(s).drain()
        got = deliveries(s)
        assert got[("hop", "a")]["status"] == "failed"
        assert "redirect" in got[("hop", "a")]["reason"] and target.arrivals == []
        assert len(hop.arrivals) == 1  # asked once, its Location never followed
        for name in ("local", "private"):
            d = got[(name, "a")]
            assert d["status"] == "failed" and "refused unless an admin allows" in d["reason"]
        assert local.arrivals == []
        assert {a["outcome"] for a in _attempts(s) if a["address"] is None} == {"refused"}
        # An admin allows the local one; the retried delivery arrives, same key, same body.
        ctl.set_destination(me, "local", allow_private=True)
        ctl.retry(me, got[("local", "a")]["delivery_id"])
        _service(s).drain()
        (arrived,) = local.wait(lambda a: len(a) == 1)
        assert arrived.verified and arrived.body == got[("local", "a")]["body"]
        assert deliveries(s)[("local", "a")]["status"] == "delivered"
    finally:
        for r in (target, hop, local):
            r.stop()


def test_retry_after_is_honoured_and_a_delivery_too_old_to_retry_fails(
    services: Services, tmp_path: Path
) -> None:
    s, me = services, admin(services)
    s.control.deploy(me, dag())
    recv = Receiver(free_port(), None)
    answers = iter([(503, {"retry-after": "1"})])
    recv.answer = lambda _a: next(answers, (500, {}))
    recv.start()
    try:
        recv.secret = _control(s).add_destination(me, "ops", recv.url, allow_private=True)
        _deliver(s, tmp_path, [alert("a", "warning", timedelta(minutes=1))])
        svc = _service(s, delivery_max_age_seconds=2.0)
        svc.drain()
        (d,) = deliveries(s).values()
        (first,) = _attempts(s)
        assert first["status_code"] == 503 and d["status"] == "pending"
        # Not sooner than the receiver asked (from before the attempt: no clock or load skew).
        assert (d["next_attempt_at"] - first["started_at"]).total_seconds() >= 1.0
        # Then 500s until the next retry would be past its age: failed, every attempt kept.
        wait_for(lambda: svc.drain(0.2) >= 0 and _by_status(s) == {"failed": 1}, 15, "gave up")
    finally:
        recv.stop()
    (d,) = deliveries(s).values()
    assert "gave up after" in d["reason"] and d["attempts"] == len(_attempts(s)) >= 2


def test_only_admins_manage_destinations_and_read_deliveries(services: Services) -> None:
    s = services
    someone, _ = user(s, "someone")
    ctl = _control(s)
    with pytest.raises(Forbidden):
        ctl.add_destination(someone, "ops", "https://example.org/hook")
    with pytest.raises(Forbidden):
        ctl.list_deliveries(someone)
    ctl.add_destination(admin(s), "ops", "https://example.org/hook")
    assert [d["name"] for d in ctl.list_destinations(admin(s))] == ["ops"]
    assert "secret" not in ctl.list_destinations(admin(s))[0]


def test_backoff_is_capped_and_jittered_and_retry_after_reads_both_forms() -> None:
    import random

    rng = random.Random(1)
    waits = [backoff(n, 1.0, 8.0, rng) for n in range(1, 8)]
    assert all(
        0.5 * min(8, 2 ** (n - 1)) <= w <= min(8, 2 ** (n - 1)) for n, w in enumerate(waits, 1)
    )
    assert retry_after("7") == 7.0
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    assert retry_after("soon") is None


def test_one_orgs_backlog_does_not_hold_back_anothers(services: Services) -> None:
    """A pass shares its batch among the orgs with due deliveries (an equal share each): an org
    with two due is served in the same pass as one with a backlog of forty older ones."""
    s = services
    busy, quiet = admin(s).org_id, uuid.uuid4()
    with s.pool.connection() as conn:
        store = DeliveryStore(conn)

        def add(org: uuid.UUID, n: int, age: float) -> None:
            for i in range(n):
                add_delivery(conn, org, key=f"k{i}")
            conn.execute(
                "UPDATE deliveries SET next_attempt_at = now() - make_interval(secs => %s)"
                " WHERE org_id = %s",
                (age, org),
            )

        add(busy, 40, 60)  # older: first in line by age alone
        add(quiet, 2, 1)
        leased = store.lease_due(limit=10, token=uuid.uuid4(), lease_seconds=30).fetchall()
        again = store.lease_due(limit=10, token=uuid.uuid4(), lease_seconds=30).fetchall()
    orgs = [r["org_id"] for r in leased]
    # Two orgs: a share of five each; the quiet one's two are taken at once.
    assert orgs.count(quiet) == 2 and orgs.count(busy) == 5
    assert {r["delivery_id"] for r in again}.isdisjoint({r["delivery_id"] for r in leased})
    assert [r["org_id"] for r in again] == [busy] * 10  # the quiet org has nothing left


def test_another_orgs_admin_sees_and_touches_none_of_an_orgs_deliveries(
    services: Services,
) -> None:
    """Destinations and deliveries are org-scoped: another org's admin, given a delivery's
    id, neither reads nor retries it, and lists nothing of it."""
    s, me = services, admin(services)
    ctl = _control(s)
    ctl.add_destination(me, "ops", "https://example.org/hook")
    with s.pool.connection() as conn:
        did = add_delivery(conn, me.org_id, status="failed", reason="x")
    other = Actor(uuid.uuid4(), uuid.uuid4(), "other", True)
    assert ctl.list_deliveries(other) == [] and ctl.list_destinations(other) == []
    assert ctl.counts(other) == {}
    with pytest.raises(NotFound):
        ctl.show(other, did)
    with pytest.raises(NotFound):  # as for an id no org has: nothing tells it exists
        ctl.retry(other, did)
    with pytest.raises(NotFound):
        ctl.set_destination(other, "ops", url="https://evil.example/")
    assert ctl.show(me, did)["status"] == "failed"  # untouched
    assert ctl.list_destinations(me)[0]["url"] == "https://example.org/hook"


def test_a_step_takes_its_wake_ups_in_one_ack_and_settles_every_attempt(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wake-up only says "a delivery is due": a step acks all it took in one call (one ack
    each was a fifth of a busy service's time), and each pipelined settle still records its
    attempt and its outcome."""
    s, me = services, admin(services)
    s.control.deploy(me, dag())
    recv = Receiver(free_port(), None).start()
    recv.secret = _control(s).add_destination(me, "ops", recv.url, allow_private=True)
    try:
        _deliver(s, tmp_path, [alert(f"a{i}", "warning", timedelta(minutes=1)) for i in range(5)])
        acks: list[tuple[str, int]] = []

        def counted(name: str) -> Callable[[str, Any], Any]:
            real = getattr(s.driver, name)

            def call(queue: str, receipts: Any) -> Any:
                acks.append((name, len(receipts) if isinstance(receipts, list) else 1))
                return real(queue, receipts)

            return call

        for name in ("ack", "ack_many"):
            monkeypatch.setattr(s.driver, name, counted(name))
        assert _service(s).step() == 5 + 5  # five wake-ups taken, five deliveries attempted
        recv.wait(lambda a: len({x.webhook_id for x in a if x.verified}) == 5)
    finally:
        recv.stop()
    assert acks == [("ack_many", 5)]
    assert _by_status(s) == {"delivered": 5}
    assert sorted(a["outcome"] for a in _attempts(s)) == ["delivered"] * 5


def test_an_idle_service_sends_new_work_on_its_wake_up_not_its_next_poll(
    services: Services,
    tmp_path: Path,
    running: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Idle, a service waits on the queue (LISTEN in Lite) instead of sleeping its poll: a
    delivery made then goes out at once, long before the 30 s poll would come round."""
    s, me = services, admin(services)
    s.control.deploy(me, dag())
    recv = Receiver(free_port(), None).start()
    recv.secret = _control(s).add_destination(me, "ops", recv.url, allow_private=True)
    waiting = threading.Event()
    receive = s.driver.receive

    def watched(*a: Any, **kw: Any) -> Any:
        if kw.get("wait_seconds"):
            waiting.set()
        return receive(*a, **kw)

    monkeypatch.setattr(s.driver, "receive", watched)
    try:
        running(1, delivery_poll_seconds=30.0)
        # Its first pass found nothing: it waits on the queue now.
        assert waiting.wait(10), "the service never waited on the queue"
        t0 = time.monotonic()
        _deliver(s, tmp_path, [alert("a", "warning", timedelta(minutes=1))])
        recv.wait(lambda a: any(x.verified for x in a), 15)
        assert time.monotonic() - t0 < 15
    finally:
        recv.stop()


def test_a_serving_service_outlives_a_queue_outage(
    services: Services,
    tmp_path: Path,
    running: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The queue away for a service's first receives (QueueUnavailable: SQS unreachable or
    throttled) does not end its loop: it tries again and sends the delivery once it is back."""
    s, me = services, admin(services)
    s.control.deploy(me, dag())
    recv = Receiver(free_port(), None).start()
    recv.secret = _control(s).add_destination(me, "ops", recv.url, allow_private=True)
    away = AwayFirst(s.driver, failures=3)
    monkeypatch.setattr(s.driver, "receive", away.receive)
    try:
        running(1)
        wait_for(lambda: away.refused == 3, 15, "the service's receives during the outage")
        _deliver(s, tmp_path, [alert("a", "warning", timedelta(minutes=1))])
        (arrived,) = recv.wait(lambda a: len(a) >= 1, 15)
    finally:
        recv.stop()
    assert arrived.verified
    wait_for(lambda: _by_status(s) == {"delivered": 1}, 15, "the delivery recorded delivered")
