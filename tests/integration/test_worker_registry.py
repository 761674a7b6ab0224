"""The worker registry (dispatcher/fleet.py) over the internal API: registration, beats and
clean stops with their refusals; the reaper declaring a silent worker dead and ending its
attempts (retried by their own policy, fenced for good); the fleet as an admin lists it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.cli import trace
from tests.support.servers import admin_key, bearer
from tests.support.wait import wait_for
from trace_platform.contract import LITE_ORG_ID, ClaimRequest, TaskSpec
from trace_platform.contract_fleet import DEAD_AFTER_BEATS
from trace_platform.control.workers import list_workers
from trace_platform.dispatcher.fleet import WorkerRegistry
from trace_platform.dispatcher.reaper import run_reaper
from trace_platform.errors import Forbidden
from trace_platform.identity import Actor, create_key, ensure_user
from trace_platform.services import Services
from trace_platform.worker.client import DispatcherClient
from trace_platform.worker.membership import Membership, new_worker_id


def registration(worker_id: str | None = None, **over: Any) -> dict[str, Any]:
    host = "elsewhere.example"
    return {
        "worker_id": worker_id or new_worker_id(host),
        "host": host,
        "pid": 4242,
        "version": "0.1.0",
        "slots": 2,
        "beat_seconds": 5.0,
    } | over


def silence(dsn: str, worker_id: str, seconds: float) -> None:
    """The worker's last beat `seconds` ago (as if it had been silent that long)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE workers SET last_beat = now() - make_interval(secs => %s) WHERE worker_id = %s",
            (seconds, worker_id),
        )


def state(dsn: str, worker_id: str) -> str | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT state FROM workers WHERE worker_id = %s", (worker_id,)
        ).fetchone()
    return row[0] if row else None


def test_register_beat_stop_and_their_refusals(api: httpx.Client, dsn: str) -> None:
    body = registration()
    wid = body["worker_id"]
    got = api.post("/internal/workers/register", json=body)
    assert got.status_code == 200, got.text
    assert got.json() == {
        "worker_id": wid,
        "state": "alive",
        "beat_seconds": 5.0,
        "dead_after_seconds": 5.0 * DEAD_AFTER_BEATS,
    }
    # Sent again (its answer lost): the same registration, a beat.
    assert api.post("/internal/workers/register", json=body).status_code == 200
    # The same id from another process is not this worker's.
    taken = api.post("/internal/workers/register", json=body | {"pid": 4343})
    assert taken.status_code == 409 and taken.json()["error"] == "worker_id_taken"
    assert api.post("/internal/workers/beat", json={"worker_id": wid}).json()["state"] == "alive"

    unknown = api.post("/internal/workers/beat", json={"worker_id": new_worker_id("nowhere")})
    assert unknown.status_code == 404 and "not registered" in unknown.json()["message"]

    stopped = api.post("/internal/workers/stop", json={"worker_id": wid})
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    again = api.post("/internal/workers/stop", json={"worker_id": wid})  # its answer lost
    assert again.status_code == 200 and again.json()["state"] == "stopped"
    late = api.post("/internal/workers/beat", json={"worker_id": wid})
    assert late.status_code == 409 and late.json()["error"] == "worker_stopped"
    assert state(dsn, wid) == "stopped"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (registration(worker_id="no colons at all"), "worker_id"),
        (registration(worker_id="h:1:abcd" + "0" * 300), "worker_id"),
        (registration(host="bad host/name"), "host"),
        (registration(host="a" * 254), "host"),
        (registration(pid=0), "pid"),
        (registration(pid=2**40), "pid"),
        (registration(slots=0), "slots"),
        (registration(beat_seconds=0), "beat_seconds"),
        (registration(beat_seconds="soon"), "beat_seconds"),
        (registration(version="1.0; DROP TABLE"), "version"),
        (registration(extra="field"), "extra"),
        ({k: v for k, v in registration().items() if k != "slots"}, "slots"),
    ],
)
def test_a_bad_registration_is_refused_naming_the_field(
    api: httpx.Client, dsn: str, body: dict[str, Any], field: str
) -> None:
    got = api.post("/internal/workers/register", json=body)
    assert got.status_code == 422, got.text
    assert field in got.text
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM workers").fetchone() == (0,)


def test_bad_beats_and_callers_without_the_token_are_refused(api: httpx.Client) -> None:
    for body in ({}, {"worker_id": "x"}, {"worker_id": new_worker_id("h"), "more": 1}, []):
        got = api.post("/internal/workers/beat", json=body)
        assert got.status_code == 422, (body, got.text)
    huge = api.post(
        "/internal/workers/beat",
        content=b'{"worker_id": "' + b"a" * (2 * 1024 * 1024) + b'"}',
        headers={"Content-Type": "application/json"},
    )
    assert huge.status_code in (413, 422)
    bare = httpx.post(f"{api.base_url}/internal/workers/register", json=registration(), timeout=10)
    assert bare.status_code == 401


def _claimed(services: Services, worker_id: str, max_attempts: int = 3) -> tuple[Any, Any]:
    d = services.dispatcher
    ref = d.create_task(TaskSpec(job="held", operator="noop", max_attempts=max_attempts))
    return ref, d.claim(ClaimRequest(task_id=ref.task_id, worker_id=worker_id))


def test_a_silent_worker_is_declared_dead_and_its_attempts_retried_and_fenced(
    api: httpx.Client, services: Services, dsn: str
) -> None:
    registry = WorkerRegistry(services.dispatcher)
    dead, alive = registration(), registration()
    for body in (dead, alive):
        assert api.post("/internal/workers/register", json=body).status_code == 200
    ref, claim = _claimed(services, dead["worker_id"])
    other, other_claim = _claimed(services, alive["worker_id"])
    # Silent for just under three beats: alive, nothing ended.
    silence(dsn, dead["worker_id"], 3 * 5.0 - 1)
    assert registry.reap_dead() == 0 and state(dsn, dead["worker_id"]) == "alive"

    silence(dsn, dead["worker_id"], 3 * 5.0 + 0.1)
    assert registry.reap_dead() == 1
    assert state(dsn, dead["worker_id"]) == "dead"
    assert state(dsn, alive["worker_id"]) == "alive"
    view = services.dispatcher.get_task(ref.task_id)
    assert view.status == "queued" and view.attempt == 1  # retried by its own policy, at once
    assert view.attempts[0].outcome == "lease_expired"
    assert "declared dead" in (view.attempts[0].error or "")
    assert services.dispatcher.get_task(other.task_id).status == "running"  # not its worker's

    # The dead worker comes back: it is told, and nothing it sends lands.
    beat = api.post("/internal/workers/beat", json={"worker_id": dead["worker_id"]})
    assert beat.status_code == 409 and beat.json()["error"] == "worker_dead"
    again = api.post("/internal/workers/register", json=dead)
    assert again.status_code == 409 and again.json()["error"] == "worker_dead"
    lease = {
        "params": {"task_id": str(ref.task_id), "attempt": 1},
        "headers": {"X-Lease-Token": str(claim.lease_token)},
    }
    hb = api.post("/internal/heartbeat", json={}, **lease)
    assert hb.status_code == 409, hb.text
    done = api.post("/internal/task-complete", json={"outcome": "succeeded"}, **lease)
    assert done.status_code == 409 and done.json()["error"] == "wrong_lease", done.text
    batch = api.post(
        "/internal/complete-batch",
        json={"completions": [{"task_id": str(ref.task_id), "attempt": 1, "outcome": "succeeded"}]},
        headers={"X-Lease-Tokens": str(claim.lease_token)},
    )
    assert batch.json()["results"][0]["error"]["error"] == "wrong_lease", batch.text
    view = services.dispatcher.get_task(ref.task_id)
    assert view.status == "queued" and view.attempts[0].outcome == "lease_expired"
    # A second reaper finds nothing more to do; the retry runs on a live worker.
    assert registry.reap_dead() == 0
    services.dispatcher.store  # noqa: B018 - the same store the reaper used
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE task_status SET next_attempt_at = now() WHERE task_id = %s", (ref.task_id,)
        )
    retry = services.dispatcher.claim(
        ClaimRequest(task_id=ref.task_id, worker_id=alive["worker_id"])
    )
    assert retry.attempt == 2
    assert other_claim.attempt == 1


def test_a_dead_workers_last_try_ends_its_task_failed(
    api: httpx.Client, services: Services, dsn: str
) -> None:
    body = registration()
    assert api.post("/internal/workers/register", json=body).status_code == 200
    ref, _ = _claimed(services, body["worker_id"], max_attempts=1)
    silence(dsn, body["worker_id"], 60)
    assert WorkerRegistry(services.dispatcher).reap_dead() == 1
    view = services.dispatcher.get_task(ref.task_id)
    assert view.status == "failed" and "declared dead" in (view.last_error or "")


@contextmanager
def reaper(services: Services, interval: float = 0.05) -> Iterator[float]:
    """The API's reaper loop, running: yields when it started (time.monotonic)."""
    stop = threading.Event()
    t = threading.Thread(target=run_reaper, args=(services.dispatcher, stop, interval))
    started = time.monotonic()
    t.start()
    try:
        yield started
    finally:
        stop.set()
        t.join(timeout=10)


def test_a_reaper_back_from_an_outage_lets_the_fleet_beat_before_judging_it(
    api: httpx.Client, services: Services, dsn: str
) -> None:
    """The API (its reaper with it) was away for a minute: every worker's last beat is that old,
    through no fault of theirs. Back, the reaper declares none dead before they had three of
    their beats to reach it (its first tick used to end the whole fleet, every running attempt
    with it); one that stays silent then is declared dead, as before."""
    beat = 0.5
    back, gone = registration(beat_seconds=beat), registration(beat_seconds=beat)
    for body in (back, gone):
        assert api.post("/internal/workers/register", json=body).status_code == 200
        silence(dsn, body["worker_id"], 60)
    ref, _ = _claimed(services, back["worker_id"])
    with reaper(services) as started:
        # `back` beats at its next beat, within one of its intervals of the API's return.
        wait_for(
            lambda: state(dsn, back["worker_id"]) != "alive" or time.monotonic() - started > beat,
            10,
            "one beat interval",
        )
        assert state(dsn, back["worker_id"]) == "alive", "declared dead for the API's outage"

        def beating_until_the_other_is_dead() -> bool:
            got = api.post("/internal/workers/beat", json={"worker_id": back["worker_id"]})
            assert got.status_code == 200, got.text
            return state(dsn, gone["worker_id"]) == "dead"

        wait_for(beating_until_the_other_is_dead, 10, "the silent worker to be declared dead")
        assert time.monotonic() - started >= DEAD_AFTER_BEATS * beat
    assert state(dsn, back["worker_id"]) == "alive"
    assert services.dispatcher.get_task(ref.task_id).status == "running"


def test_a_lease_lapsed_in_an_outage_is_ended_only_after_a_lease_watched(
    services: Services, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API (or its database) was away longer than a lease: every running attempt's lease
    lapsed with no beat able to land. Back, the reaper ends none of those leases before it has
    watched a whole lease (the workers beat again meanwhile); a passed deadline, which no beat
    moves, it ends at once; a lease still lapsed then, it ends as before."""
    lease = 1.5
    d = services.dispatcher
    monkeypatch.setattr(d, "settings", d.settings.model_copy(update={"lease_seconds": lease}))
    (lapsed, _), (late, _) = _claimed(services, "w-lapsed"), _claimed(services, "w-late")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE task_status SET lease_until = now() - interval '1 minute' WHERE task_id = %s",
            [lapsed.task_id],
        )
        conn.execute(
            "UPDATE task_status SET deadline_at = now() - interval '1 second' WHERE task_id = %s",
            [late.task_id],
        )
    with reaper(services) as started:
        wait_for(lambda: d.get_task(late.task_id).status != "running", 10, "the deadline ended")
        if time.monotonic() - started < lease:  # else a loaded machine's first tick was slow
            assert d.get_task(lapsed.task_id).status == "running"
        wait_for(lambda: d.get_task(lapsed.task_id).status != "running", 20, "the lease ended")
        assert time.monotonic() - started >= lease
    assert "exceeded its timeout" in (d.get_task(late.task_id).last_error or "")
    assert "lost its lease" in (d.get_task(lapsed.task_id).last_error or "")


def test_a_reaper_that_lost_the_database_watches_again_before_judging(
    api: httpx.Client, services: Services, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The database away (here: the registry unreadable) while the reaper runs on, for longer
    than a beat: no beat lands meanwhile, so once it is back the reaper watches for three
    beats again first. (A failure shorter than a beat stops no beat, and keeps the watch.)"""
    beat = 0.5
    body = registration(beat_seconds=beat)
    assert api.post("/internal/workers/register", json=body).status_code == 200

    def beating_for(seconds: float) -> bool:
        got = api.post("/internal/workers/beat", json={"worker_id": body["worker_id"]})
        assert got.status_code == 200, got.text
        return time.monotonic() - started > seconds

    with reaper(services) as started:
        # Beating while the reaper watches long enough to judge a worker of this beat.
        wait_for(lambda: beating_for(DEAD_AFTER_BEATS * beat + 0.2), 10, "the watch to age")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE workers RENAME TO workers_away")
            away = time.monotonic()
            # The records' messages, not caplog.text: a JSON log formatter another test of the
            # process installed escapes the quotes in the text.
            wait_for(
                lambda: (
                    any('workers" does not exist' in r.getMessage() for r in caplog.records)
                    and time.monotonic() - away > 2 * services.settings.heartbeat_seconds
                ),
                10,
                "failed ticks for longer than a beat",
            )
            conn.execute("UPDATE workers_away SET last_beat = now() - interval '60 s'")
            conn.execute("ALTER TABLE workers_away RENAME TO workers")
        back = time.monotonic()
        wait_for(lambda: time.monotonic() - back > beat, 10, "one beat interval")
        assert state(dsn, body["worker_id"]) == "alive", "declared dead for the database's outage"
        wait_for(lambda: state(dsn, body["worker_id"]) == "dead", 10, "declared dead, silent")


def test_the_membership_registers_beats_stops_and_hears_it_is_dead(
    client: Any, services: Services, dsn: str
) -> None:
    told: list[str] = []
    member = Membership(
        client, host="elsewhere.example", slots=3, beat_seconds=60, on_dead=told.append
    ).start()
    assert member.registered and state(dsn, member.worker_id) == "alive"
    listed = WorkerRegistry(services.dispatcher).list(LITE_ORG_ID)
    assert [(w.worker_id, w.host, w.slots, w.running) for w in listed] == [
        (member.worker_id, "elsewhere.example", 3, 0)
    ]
    member.stop()
    assert state(dsn, member.worker_id) == "stopped"

    dying = Membership(client, host="h", slots=1, beat_seconds=60, on_dead=told.append).start()
    silence(dsn, dying.worker_id, 600)
    WorkerRegistry(services.dispatcher).reap_dead()
    assert dying._beat() is False  # its next beat
    assert len(told) == 1 and "declared dead" in told[0] and dying.dead is not None
    dying.stop()
    assert state(dsn, dying.worker_id) == "dead"  # a dead worker stays dead


def test_a_worker_beats_on_through_a_passing_404(client: Any, dsn: str) -> None:
    """Once registered, a 404 or 405 that is not the registry's own answer (a proxy's page
    while the API restarts behind it) is passing: the worker beats on. Its beat thread used to
    take the second one for an API without a registry and end, so the worker, still running
    tasks, was declared dead three beats later, its attempts retried elsewhere, and it kept
    claiming under a dead id, never told."""
    told: list[str] = []
    pool = client.http.pool
    proxy_page = DispatcherClient(f"{pool.scheme}://{pool.host}:{pool.port}/not-here", retries=0)
    member = Membership(client, host="h", slots=1, beat_seconds=60, on_dead=told.append).start()
    try:
        assert member.registered
        member.client = proxy_page  # the API away behind its proxy: 404 for every path
        for _ in range(3):
            assert member._beat() is True, "the beat thread gave up"
        member.client = client  # back
        assert member._beat() is True and member.registered and told == []
        assert state(dsn, member.worker_id) == "alive"
        # An API that never had a registry is still let be (the worker runs unregistered).
        old = Membership(proxy_page, host="h", slots=1, beat_seconds=60, on_dead=told.append)
        assert old._beat() is False and not old.registered and told == []
    finally:
        member.stop()
        proxy_page.close()


def test_the_fleet_is_listed_for_admins_only(
    api: httpx.Client, services: Services, dsn: str, settings: Any
) -> None:
    body = registration()
    api.post("/internal/workers/register", json=body)
    _claimed(services, body["worker_id"])
    got = api.get("/v1/workers")
    assert got.status_code == 200, got.text
    (w,) = got.json()
    assert (w["worker_id"], w["host"], w["slots"], w["running"], w["state"]) == (
        body["worker_id"],
        "elsewhere.example",
        2,
        1,
        "alive",
    )
    assert api.get("/v1/workers", params={"state": "dead"}).json() == []
    assert api.get("/v1/workers", params={"state": "zombie"}).status_code == 422
    nobody = Actor(uuid.uuid4(), uuid.uuid4(), "nobody", is_admin=False)
    with pytest.raises(Forbidden, match="only org admins may list the workers"):
        list_workers(services.dispatcher, nobody)

    env = {"TRACE_STATE_DSN": dsn, "TRACE_HOME": str(settings.home), "TRACE_AUTH": "permissive"}
    out = trace(["workers", "list", "--json"], env)
    assert out.returncode == 0, out.stderr
    assert '"host": "elsewhere.example"' in out.stdout and '"running": 1' in out.stdout
    table = trace(["workers", "list"], env)
    assert table.returncode == 0, table.stderr
    assert body["worker_id"] in table.stdout and "alive" in table.stdout


def test_an_org_admin_sees_the_fleet_but_not_other_orgs_load(
    secure: tuple[Services, str],
) -> None:
    """The workers are the platform's, shared by every org: an admin of one org sees them
    (where its tasks run), but a worker's running tasks counted are the admin's own org's
    alone: another org's load through it would tell one tenant when another is busy. Not
    for a non-admin, nor the workers' internal token, nor nobody."""
    svc, url = secure
    token = {"X-Internal-Token": svc.internal_token or ""}
    body = registration()
    assert httpx.post(f"{url}/internal/workers/register", json=body, headers=token).is_success
    _claimed(svc, body["worker_id"])  # a Lite org task, running on it
    other = uuid.uuid4()
    with svc.pool.connection() as conn, conn.transaction():
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'other')", (other,))
        eve = bearer(create_key(conn, ensure_user(conn, other, "eve", is_admin=True).user_id))
        bob = bearer(create_key(conn, ensure_user(conn, other, "bob").user_id))

    def running(headers: dict[str, str]) -> list[tuple[str, int]]:
        got = httpx.get(f"{url}/v1/workers", headers=headers)
        assert got.status_code == 200, got.text
        return [(w["worker_id"], w["running"]) for w in got.json()]

    assert running(bearer(admin_key(svc))) == [(body["worker_id"], 1)]
    assert running(eve) == [(body["worker_id"], 0)]
    for headers, status in ((bob, 403), (token, 401), ({}, 401)):
        assert httpx.get(f"{url}/v1/workers", headers=headers).status_code == status
