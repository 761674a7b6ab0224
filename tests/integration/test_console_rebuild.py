"""A DAG page's live rebuild over a real API (keys required) and the harness's Postgres: the
stream sends the rebuild panel, a new one when a rebuild job's task completes, the cutover
button enabled once nothing blocks it, then `done` after the cutover; only who may see the
rebuild on the page may follow it; its streams count against the same caps as the run tree's.
The rebuild's tasks are driven by hand through the Dispatcher (tests/support/safe_change.py)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.support.console import check_stream_caps, console, inline_problems, post, sse
from tests.support.dags import admin, user
from tests.support.safe_change import claimable, deployed_live, finish, pipeline, run_all, start
from tests.support.servers import admin_key
from trace_platform.identity import create_key, ensure_user
from trace_platform.services import Services

EVENTS = "/console/dags/chg/rebuild/events"
BUTTON = "Cut over to version 2</button>"


@pytest.fixture
def rebuilding(secure: tuple[Services, str]) -> tuple[Services, str]:
    """`chg` version 1 live with two ranges, and version 2 (decode's config changed) deployed
    with manual cutover: its two decode tasks queued, nothing run (the API here cuts nothing
    over by itself)."""
    svc, url = secure
    deployed_live(svc)
    svc.control.deploy(admin(svc), pipeline("b"), manual_cutover=True)
    return svc, url


def disabled(panel: str) -> bool:
    button = panel[panel.rindex("<button", 0, panel.index(BUTTON)) :]
    return button.startswith('<button type="submit" disabled')


def test_the_rebuild_streams_until_cutover(rebuilding: tuple[Services, str]) -> None:
    svc, url = rebuilding
    with console(url, admin_key(svc)) as c:
        page = c.get("/console/dags/chg")
        assert f'data-sse="{EVENTS}" data-sse-event="rebuild"' in page.text
        assert inline_problems(page.text) == [] and disabled(page.text)
        with c.stream("GET", EVENTS) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse(r)
            name, first = next(events)
            assert name == "rebuild" and "Rebuild of version 2" in first
            assert "Cutover is blocked: 2 rebuild tasks still queued" in first and disabled(first)
            assert "<td>decode</td><td>2</td><td>0</td>" in first  # job, tasks, succeeded
            # One rebuild task of decode completes: the panel is sent again, still blocked
            # (the agg task it started now waits).
            ref, payload = start(svc, claimable(svc)[0])
            assert (payload.job, payload.dag_version) == ("decode", 2)
            finish(svc, ref, payload)
            name, second = next(events)
            assert name == "rebuild" and "<td>decode</td><td>2</td><td>1</td>" in second
            assert disabled(second)
            # The rest of the rebuild runs: nothing blocks, the button is enabled.
            run_all(svc)
            for name, panel in events:
                assert name == "rebuild" and "Rebuild of version 2" in panel
                if "Complete: ready to cut over." in panel:
                    break
            assert not disabled(panel) and "Cutover is blocked" not in panel
            assert inline_problems(panel) == [] and 'name="csrf"' in panel
            assert post(c, "/console/dags/chg/cutover").status_code == 303
            (name, last), done = list(events)
            assert name == "rebuild" and "Cut over to version 2." in last and BUTTON not in last
            assert done == ("done", "Cut over to version 2.")
        # No rebuild in flight: the panel says so and the stream is done at once.
        assert svc.control.changes.status(admin(svc), "chg")["active_version"] == 2
        with c.stream("GET", EVENTS) as r:
            assert [(e, d.split(" <a ")[0]) for e, d in sse(r)][-1] == (
                "done",
                "No rebuild in flight.",
            )


def test_a_newer_deploy_ends_the_stream_it_supersedes(rebuilding: tuple[Services, str]) -> None:
    svc, url = rebuilding
    with console(url, admin_key(svc)) as c, c.stream("GET", EVENTS) as r:
        events = sse(r)
        assert "Rebuild of version 2" in next(events)[1]
        svc.control.deploy(admin(svc), pipeline("c"), manual_cutover=True)
        (name, last), done = list(events)
        assert name == "rebuild" and BUTTON not in last
        assert done == ("done", "Superseded by the rebuild of version 3.")


def test_only_who_sees_the_rebuild_on_the_page_may_follow_it(
    rebuilding: tuple[Services, str],
) -> None:
    svc, url = rebuilding
    _, bob_key = user(svc, "bob")  # no role
    # A reader of one of its datasets sees the DAG's page, not its rebuild.
    svc.control.set_read_roles(admin(svc), "chg_agg", ["analyst"], [])
    _, reader_key = user(svc, "rita", ["analyst"])
    other = uuid.uuid4()
    with svc.pool.connection() as conn, conn.transaction():
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'other')", (other,))
        eve_key = create_key(conn, ensure_user(conn, other, "eve", is_admin=True).user_id)
    for key in (bob_key, reader_key, eve_key):
        with console(url, key) as c:
            r = c.get(EVENTS)
            assert r.status_code == 404 and "Rebuild" not in r.text and "decode" not in r.text
            page = c.get("/console/dags/chg")
            assert "Rebuild of version" not in page.text and EVENTS not in page.text
    with httpx.Client(base_url=url) as anon:
        assert anon.get(EVENTS).status_code == 401


def test_rebuild_streams_count_against_the_live_caps(
    rebuilding: tuple[Services, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, url = rebuilding
    run_id = svc.control.list_runs(admin(svc), "chg", 1)[0]["run_id"]
    # The run tree's stream is refused too: both count against the same caps.
    runs = (f"/console/runs/{run_id}/events",)
    check_stream_caps(url, admin_key(svc), _second_admin(svc), EVENTS, monkeypatch, runs)


def _second_admin(svc: Services) -> str:
    with svc.pool.connection() as conn, conn.transaction():
        return create_key(conn, ensure_user(conn, admin(svc).org_id, "ann", is_admin=True).user_id)
