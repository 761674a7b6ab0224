"""The web console over a real API (keys required) and the harness's Postgres: who may log in,
what each user sees (exactly what the API shows them), CSRF refusals, the CSP header and no
inline script on any page, the live run tree over server-sent events, and safe change."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.console import console, csrf_of, inline_problems, post
from tests.support.dags import admin, three_jobs, user
from tests.support.servers import admin_key, bearer
from trace_platform.console.web import CSP
from trace_platform.identity import Actor, create_key, ensure_user
from trace_platform.services import Services


@pytest.fixture
def hello(secure: tuple[Services, str]) -> Iterator[tuple[Services, str, str]]:
    """A deployed three-job DAG `hello` and one run of it (no worker: it stays queued):
    (services, URL, run id)."""
    svc, url = secure
    svc.control.deploy(admin(svc), three_jobs())
    run = svc.control.trigger(admin(svc), "hello")
    yield svc, url, str(run["run_id"])


def sse_events(c: httpx.Client, path: str, until: str) -> list[tuple[str, str]]:
    """The (event, data) pairs of a console stream, read until an event named `until`."""
    out: list[tuple[str, str]] = []
    with c.stream("GET", path) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        event, data = "", []
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data.append(line.removeprefix("data: "))
            elif line == "" and event:
                out.append((event, "\n".join(data)))
                if event == until:
                    return out
                event, data = "", []
    return out


def test_the_console_needs_a_valid_key_and_keeps_it_in_a_strict_cookie(
    secure: tuple[Services, str],
) -> None:
    svc, url = secure
    with httpx.Client(base_url=url) as anon:
        for path in ("/console/dags", "/console/datasets", f"/console/runs/{uuid.uuid4()}/events"):
            r = anon.get(path)
            assert r.status_code == 401 and 'name="key"' in r.text, path
        page = anon.get("/console/login")
        bad = anon.post("/console/login", data={"key": "trc_nope", "csrf": csrf_of(page)})
        assert bad.status_code == 401 and "unknown or revoked API key" in bad.text
        assert "trace_console_key" not in anon.cookies
        good = anon.post("/console/login", data={"key": admin_key(svc), "csrf": csrf_of(page)})
        assert good.status_code == 303
        cookie = next(
            v for k, v in good.headers.multi_items() if v.startswith("trace_console_key=")
        )
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
        assert anon.get("/console/dags").status_code == 200
        assert post(anon, "/console/logout").status_code == 303
        assert anon.get("/console/dags").status_code == 401


def test_posts_without_the_token_or_from_another_origin_change_nothing(
    hello: tuple[Services, str, str],
) -> None:
    svc, url, _ = hello
    with console(url, admin_key(svc)) as c:
        token = csrf_of(c.get("/console/dags/hello"))
        before = len(svc.control.list_runs(admin(svc)))
        assert c.post("/console/dags/hello/trigger").status_code == 403
        assert c.post("/console/dags/hello/trigger", data={"csrf": "x" * 43}).status_code == 403
        foreign = c.post(
            "/console/dags/hello/trigger",
            data={"csrf": token},
            headers={"Origin": "http://evil.example"},
        )
        assert foreign.status_code == 403 and "own origin" in foreign.text
        assert c.post("/console/dags/hello/pause").status_code == 403
        assert len(svc.control.list_runs(admin(svc))) == before
        assert not svc.control.list_dags(admin(svc))[0]["paused"]
        ok = c.post("/console/dags/hello/trigger", data={"csrf": token})
        assert ok.status_code == 303 and ok.headers["location"].startswith("/console/runs/")
        assert len(svc.control.list_runs(admin(svc))) == before + 1


def test_every_page_sends_the_csp_and_holds_nothing_inline(
    hello: tuple[Services, str, str],
) -> None:
    svc, url, run_id = hello
    pages = [
        "/console/login",
        "/console/dags",
        "/console/dags/hello",
        "/console/dags/hello?a=1&b=1",
        "/console/deploy?dag=hello",
        "/console/runs",
        f"/console/runs/{run_id}",
        "/console/datasets",
        "/console/datasets/hello_raw",
        "/console/query?dataset=hello_raw",
        "/console/alerts",
        "/console/datasets/nope",  # an error page
    ]
    with console(url, admin_key(svc)) as c:
        for path in pages:
            r = c.get(path)
            assert r.status_code in (200, 404), (path, r.status_code)
            assert r.headers["content-security-policy"] == CSP, path
            assert CSP.startswith("default-src 'self';")
            assert inline_problems(r.text) == [], path
        queried = post(c, "/console/query", {"sql": "SELECT 1 AS x, 2 AS y", "x": "x", "y": "y"})
        assert queried.status_code == 200 and inline_problems(queried.text) == []
        assert "<svg" in queried.text and 'class="bar"' in queried.text
        for asset, kind in (("console.js", "javascript"), ("console.css", "text/css")):
            r = c.get(f"/console/static/{asset}")
            assert r.status_code == 200 and kind in r.headers["content-type"]
            assert r.headers["content-security-policy"] == CSP


def test_a_no_role_user_and_another_orgs_admin_see_none_of_it(
    hello: tuple[Services, str, str],
) -> None:
    svc, url, run_id = hello
    _, bob_key = user(svc, "bob")
    other = uuid.uuid4()
    with svc.pool.connection() as conn, conn.transaction():
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'other')", (other,))
        eve_key = create_key(conn, ensure_user(conn, other, "eve", is_admin=True).user_id)
    for key in (bob_key, eve_key):
        # What the API shows them: nothing.
        assert httpx.get(f"{url}/v1/dags", headers=bearer(key)).json() == []
        assert httpx.get(f"{url}/v1/runs/{run_id}", headers=bearer(key)).status_code == 404
        with console(url, key) as c:
            for path in ("/console/dags", "/console/runs", "/console/datasets"):
                r = c.get(path)
                assert r.status_code == 200
                assert "hello" not in r.text and run_id[:8] not in r.text, path
            for path in (
                "/console/dags/hello",
                f"/console/runs/{run_id}",
                f"/console/runs/{run_id}/events",
                "/console/datasets/hello_raw",
                "/console/datasets/hello_clean",
            ):
                r = c.get(path)
                assert r.status_code == 404 and "task_id" not in r.text, path
            # The same page as for what does not exist, but for the name.
            unknown = c.get("/console/dags/nope").text.replace("nope", "hello")
            assert c.get("/console/dags/hello").text == unknown
            query = post(c, "/console/query", {"sql": "SELECT * FROM hello_raw"})
            assert query.status_code == 422 and "<table" not in query.text
            assert post(
                c, "/console/query.csv", {"sql": "SELECT * FROM hello_raw"}
            ).status_code in (
                403,
                404,
                422,
            )
            # Refused as the API refuses the same call (the same status), changing nothing.
            for action in ("trigger", "pause", "cutover", "rollback"):
                api = httpx.post(f"{url}/v1/dags/hello/{action}", headers=bearer(key))
                r = post(c, f"/console/dags/hello/{action}")
                assert r.status_code == api.status_code in (403, 404), action
                assert "CSRF" not in r.text
            assert post(c, f"/console/runs/{run_id}/cancel").status_code == 404
            assert post(c, f"/console/runs/{run_id}/again").status_code == 404
    assert len(svc.control.list_runs(admin(svc))) == 1
    assert svc.control.show_run(admin(svc), uuid.UUID(run_id))["tasks"][0]["status"] == "queued"
    assert not svc.control.list_dags(admin(svc))[0]["paused"]


def test_a_reader_of_a_dataset_sees_it_but_not_the_dags_spec_or_runs(
    hello: tuple[Services, str, str],
) -> None:
    svc, url, run_id = hello
    svc.control.set_read_roles(admin(svc), "hello_raw", ["analyst"], [])
    _, key = user(svc, "ann", ["analyst"])
    with console(url, key) as c:
        assert "hello" in c.get("/console/dags").text
        page = c.get("/console/dags/hello")
        assert page.status_code == 200 and "hello_raw" in page.text
        assert "source" not in page.text and "Trigger" not in page.text
        assert run_id[:8] not in page.text and run_id[:8] not in c.get("/console/runs").text
        assert c.get("/console/datasets/hello_raw").status_code == 200
        assert c.get("/console/datasets/hello_clean").status_code == 404
        assert post(c, "/console/dags/hello/trigger").status_code == 403


def test_the_run_tree_streams_live_and_cancel_ends_it(hello: tuple[Services, str, str]) -> None:
    svc, url, _ = hello
    with console(url, admin_key(svc)) as c:
        triggered = post(c, "/console/dags/hello/trigger")
        run_path = triggered.headers["location"]
        page = c.get(run_path)
        assert 'data-sse="' + run_path + '/events"' in page.text
        # Its tasks are queued (no worker): the stream sends the tree and stays open.
        with c.stream("GET", run_path + "/events") as r:
            lines = r.iter_lines()
            assert next(lines) == "event: tree"
            first = "\n".join(iter(lambda: next(lines), ""))
        assert "source" in first and "queued" in first and 'data-status="running"' in first
        canceled = post(c, run_path + "/cancel")
        assert canceled.status_code == 303
        events = sse_events(c, run_path + "/events", until="done")
        assert [e for e, _ in events] == ["tree", "done"]
        assert 'data-status="canceled"' in events[0][1]
        again = post(c, run_path + "/again")
        assert again.status_code == 303 and again.headers["location"] != run_path
        # A run's buttons are one action table: an action it lacks is the console's 404 page.
        nope = post(c, run_path + "/nope")
        assert nope.status_code == 404 and "no action &#39;nope&#39;" in nope.text, nope.text


def test_the_dataset_page_reads_each_dag_version_spec_once(
    hello: tuple[Services, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lineage needs every visible DAG's spec: read once per DAG version, not once per DAG
    on every view (the page's other reads do not grow with the DAGs either)."""
    svc, url, _ = hello
    me = admin(svc)
    for name in ("one", "two", "three"):
        svc.control.deploy(me, three_jobs(name))
    read: list[str] = []
    show_dag = svc.control.show_dag

    def counted(actor: Actor, name: str, version: int | None = None) -> dict[str, Any]:
        read.append(name)
        return show_dag(actor, name, version)

    monkeypatch.setattr(svc.control, "show_dag", counted)
    with console(url, admin_key(svc)) as c:
        for _ in range(3):
            page = c.get("/console/datasets/hello_clean")
            assert page.status_code == 200 and "/console/datasets/hello_raw" in page.text
        assert sorted(read) == ["hello", "one", "three", "two"]
        # A new version cut over: its spec is read once, at the next view.
        edited = three_jobs().replace("count: 1, final: 1", "count: 2, final: 1")
        svc.control.deploy(me, edited)
        svc.control.changes.cutover(me, "hello")
        for _ in range(2):
            assert c.get("/console/datasets/hello_clean").status_code == 200
        assert sorted(read) == ["hello", "hello", "one", "three", "two"]


def test_deploy_diff_then_deploy_pause_and_roll_back(hello: tuple[Services, str, str]) -> None:
    svc, url, _ = hello
    edited = three_jobs().replace("count: 1, final: 1", "count: 2, final: 1")
    with console(url, admin_key(svc)) as c:
        diff = post(c, "/console/deploy", {"yaml": edited, "do": "diff"})
        assert diff.status_code == 200 and "transform" in diff.text, diff.text
        assert svc.control.show_dag(admin(svc), "hello")["version"] == 1  # a dry run
        done = post(c, "/console/deploy", {"yaml": edited, "do": "deploy"})
        assert done.status_code == 303 and done.headers["location"] == "/console/dags/hello"
        page = c.get("/console/dags/hello?a=1&b=2")
        assert "-      count: 1" in page.text and "+      count: 2" in page.text
        assert post(c, "/console/dags/hello/pause").status_code == 303
        assert svc.control.list_dags(admin(svc))[0]["paused"]
        assert post(c, "/console/dags/hello/resume").status_code == 303
        assert not svc.control.list_dags(admin(svc))[0]["paused"]
        bad = post(c, "/console/dags/hello/rollback", {"to": "x"})
        assert bad.status_code == 422
        # The edit changes what transform writes: version 2 builds beside the live version 1
        # (nothing to replay here, so it is complete at once), then is cut over by hand.
        assert "Rebuild of version 2" in page.text and "Cut over to version 2" in page.text
        cut = post(c, "/console/dags/hello/cutover")
        assert cut.status_code == 303, cut.text
        assert "cut over to version 2" in c.get(cut.headers["location"]).text
        assert svc.control.list_dags(admin(svc))[0]["active_version"] == 2
        back = post(c, "/console/dags/hello/rollback")
        assert back.status_code == 303, back.text
        assert "rolled back: version 1" in c.get(back.headers["location"]).text
        status = svc.control.changes.status(admin(svc), "hello")
        assert (status["active_version"], status["building_version"]) == (1, None)
