"""The web console attacked as a hostile user or another tenant would: a key revoked while its
live stream runs, operator text that tries to forge stream events or markup, streams held open
by the hundred, a cross-site link that would log the browser out, cross-site and origin-less
posts, every state change a token-checked POST, and markup in query results."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from tests.support.alerts import add_delivery
from tests.support.console import (
    check_stream_caps,
    console,
    csrf_of,
    inline_problems,
    post,
    sse,
)
from tests.support.dags import admin, three_jobs, user
from tests.support.servers import admin_key, bearer
from tests.support.wait import wait_for
from trace_platform.api.app import create_app
from trace_platform.console import live, runs
from trace_platform.console.web import form
from trace_platform.contract import ClaimRequest, CompleteRequest
from trace_platform.identity import create_key, ensure_user
from trace_platform.services import Services


@pytest.fixture
def hello(secure: tuple[Services, str]) -> Iterator[tuple[Services, str, str]]:
    """A deployed three-job DAG `hello` and one run of it (no worker: it stays queued):
    (services, URL, run id)."""
    svc, url = secure
    svc.control.deploy(admin(svc), three_jobs())
    run = svc.control.trigger(admin(svc), "hello")
    yield svc, url, str(run["run_id"])


def second_admin(svc: Services, name: str) -> str:
    """An org admin of the Lite org besides its own admin: their key."""
    with svc.pool.connection() as conn, conn.transaction():
        return create_key(conn, ensure_user(conn, admin(svc).org_id, name, is_admin=True).user_id)


def api_routes(routes: list[BaseRoute]) -> Iterator[APIRoute]:
    """Every route of an app, into its included routers (FastAPI keeps them nested)."""
    for r in routes:
        if isinstance(r, APIRoute):
            yield r
        elif (inner := getattr(r, "original_router", None)) is not None:
            yield from api_routes(inner.routes)


def test_a_key_revoked_mid_stream_ends_the_stream_at_once(
    hello: tuple[Services, str, str],
) -> None:
    svc, url, run_id = hello
    ann = second_admin(svc, "ann")
    with console(url, ann) as c, c.stream("GET", f"/console/runs/{run_id}/events") as r:
        events = sse(r)
        assert next(events)[0] == "tree"
        removed = httpx.delete(f"{url}/v1/users/ann", headers=bearer(admin_key(svc)))
        assert removed.status_code == 200, removed.text
        wait_for(
            lambda: httpx.get(f"{url}/v1/dags", headers=bearer(ann)).status_code == 401,
            what="the API to refuse ann's key",
        )
        # The run changes after the key is refused: a stream still acting as ann would send
        # its new tree (canceled) to someone who may no longer see it.
        svc.control.cancel_run(admin(svc), uuid.UUID(run_id))
        event, data = next(events)
        assert (event, "revoked" in data) == ("done", True), (event, data)


def test_operator_text_cannot_forge_stream_events_or_markup(
    hello: tuple[Services, str, str],
) -> None:
    svc, url, run_id = hello
    (source,) = svc.control.show_run(admin(svc), uuid.UUID(run_id))["tasks"]
    d = svc.dispatcher
    c = d.claim(ClaimRequest(task_id=source["task_id"], worker_id="w"))
    # A task's error is what its code raised: any text, written by whoever wrote the job.
    forged = (
        "boom\r\revent: done\rdata: forged\r\r"
        "event: tree\rdata: Status: succeeded\r\r<img src=x onerror=alert(1)>"
    )
    d.complete(
        CompleteRequest(
            task_id=c.task_id,
            attempt=c.attempt,
            lease_token=c.lease_token,
            outcome="failed",
            error=forged,
            retryable=False,
        )
    )
    with console(url, admin_key(svc)) as cl:
        page = cl.get(f"/console/runs/{run_id}")
        assert "<img" not in page.text and inline_problems(page.text) == []
        with cl.stream("GET", f"/console/runs/{run_id}/events") as r:
            events = list(sse(r))
    assert [e for e, _ in events] == ["tree", "done"], events
    tree, done = events[0][1], events[1][1]
    assert "forged" in tree and "&lt;img" in tree and "<img" not in tree
    assert 'data-status="failed"' in tree and done == "finished"


def test_the_live_tree_is_read_and_rendered_off_the_event_loop(
    hello: tuple[Services, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big run's tree takes long to render (~0.4 s for 10,000 tasks): on the event loop,
    every stream's poll would stall every request of the process, workers' included."""
    svc, url, run_id = hello
    on_loop: list[bool] = []
    render = runs.tree_html

    def spy(run: dict[str, Any]) -> str:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:  # a pool thread
            on_loop.append(False)
        return render(run)

    monkeypatch.setattr(runs, "tree_html", spy)
    svc.control.cancel_run(admin(svc), uuid.UUID(run_id))
    with console(url, admin_key(svc)) as c, c.stream("GET", f"/console/runs/{run_id}/events") as r:
        assert [e for e, _ in sse(r)] == ["tree", "done"]
    assert on_loop and not any(on_loop)


def test_live_streams_are_bounded_per_user_and_in_all(
    hello: tuple[Services, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, url, run_id = hello
    path = f"/console/runs/{run_id}/events"
    check_stream_caps(url, admin_key(svc), second_admin(svc, "ann"), path, monkeypatch)
    # Every stream closed: a user starts from none again.
    with console(url, admin_key(svc)) as c, ExitStack() as held:
        for _ in range(live.STREAMS_PER_USER):
            wait_for(
                lambda: held.enter_context(c.stream("GET", path)).status_code == 200,
                what="a place",
            )


def test_a_burst_of_streams_is_held_to_the_caps_before_anything_is_read(
    hello: tuple[Services, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streams opened all at once: each is admitted or refused before its first read, so a
    burst never has more reads (pool threads, Postgres reads) in flight than the caps allow,
    per user and in all. A stream whose first read fails gives its place back."""
    svc, url, run_id = hello
    path = f"/console/runs/{run_id}/events"
    per_user, total = live.STREAMS_PER_USER, live.STREAMS_PER_USER + 2
    monkeypatch.setattr(live, "STREAMS_TOTAL", total)
    ann = second_admin(svc, "ann")
    burst = [admin_key(svc)] * (2 * per_user) + [ann] * per_user
    lock, gate = threading.Lock(), threading.Event()
    reading: dict[uuid.UUID, int] = {}  # reads in flight, by user
    peak: dict[uuid.UUID | str, int] = {}  # the most at once, by user and in "all"
    refused: list[int] = []
    show_run = svc.control.show_run

    def held(me: Any, rid: uuid.UUID) -> dict[str, Any]:
        """show_run, held until every request of the burst is answered or reading."""
        with lock:
            reading[me.user_id] = reading.get(me.user_id, 0) + 1
            for who, n in ((me.user_id, reading[me.user_id]), ("all", sum(reading.values()))):
                peak[who] = max(peak.get(who, 0), n)
        try:
            gate.wait(60)  # only a bound if the test fails: it is opened below
            return show_run(me, rid)
        finally:
            with lock:
                reading[me.user_id] -= 1

    monkeypatch.setattr(svc.control, "show_run", held)
    with ExitStack() as clients:
        logged_in = {k: clients.enter_context(console(url, k)).cookies for k in set(burst)}

        def open_stream(key: str) -> int:
            with (
                httpx.Client(base_url=url, cookies=logged_in[key], timeout=60) as c,
                c.stream("GET", path) as r,
            ):
                if r.status_code == 429:
                    with lock:
                        refused.append(r.status_code)
                return r.status_code

        with ThreadPoolExecutor(len(burst)) as pool:
            try:
                answers = [pool.submit(open_stream, k) for k in burst]
                wait_for(
                    lambda: sum(reading.values()) + len(refused) == len(burst),
                    what="every stream of the burst reading or refused",
                )
                by_user = [n for who, n in peak.items() if who != "all"]
                assert peak["all"] <= total and max(by_user) <= per_user, peak
            finally:
                gate.set()
            statuses = sorted(a.result() for a in answers)
        assert statuses == [200] * total + [429] * (len(burst) - total), statuses
    monkeypatch.setattr(svc.control, "show_run", show_run)
    # A first read that fails (no such run: the API's 404) holds no place afterwards.
    with console(url, admin_key(svc)) as c, ExitStack() as held_open:
        for _ in range(per_user + 1):
            assert c.get(f"/console/runs/{uuid.uuid4()}/events").status_code == 404
        for _ in range(per_user):
            wait_for(
                lambda: held_open.enter_context(c.stream("GET", path)).status_code == 200,
                what="a place, the burst's streams closed",
            )


def test_a_malformed_id_in_any_console_path_is_the_consoles_own_page(
    hello: tuple[Services, str, str],
) -> None:
    """FastAPI refuses a path parameter that is not a UUID with the API's JSON 422: on the
    console it is the console's page (404: the path names nothing), for every route with an
    id in its path; a bad query parameter is its 422 page."""
    svc, url, _ = hello
    routes = [
        r
        for r in api_routes(create_app(svc, background=False).routes)
        if r.path.startswith("/console")
        and any(p.field_info.annotation is uuid.UUID for p in r.dependant.path_params)
    ]
    assert {"/console/runs/{run_id}", "/console/deliveries/{delivery_id}/retry"} <= {
        r.path for r in routes
    }
    fill = {"run_id": "not-a-uuid", "delivery_id": "not-a-uuid", "action": "cancel"}

    def is_console_page(r: httpx.Response) -> bool:
        return r.headers["content-type"].startswith("text/html") and '<main id="main"' in r.text

    with console(url, admin_key(svc)) as c:
        for route in routes:
            path = route.path.format(**fill)
            for method in route.methods:
                r = post(c, path) if method == "POST" else c.request(method, path)
                assert r.status_code == 404 and is_console_page(r), (method, path, r.text)
                assert "&#39;not-a-uuid&#39; is no" in r.text, r.text
        bad = c.get("/console/dags/hello?a=x&b=1")
        assert bad.status_code == 422 and is_console_page(bad), bad.text
        # A path that names no page, or a page asked with a method it does not take: the
        # console's 404 too (was the API's JSON 404, and Starlette's plain-text 405).
        for method, path in [
            ("GET", "/console/nowhere"),
            ("GET", "/console/runs/00000000-0000-0000-0000-000000000000/cancel"),
            ("POST", "/console/nowhere/at/all"),
            ("DELETE", "/console/dags"),
        ]:
            r = post(c, path) if method == "POST" else c.request(method, path)
            assert r.status_code == 404 and is_console_page(r), (method, path, r.text)
        css = c.get("/console/static/console.css")  # the static files are still served
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")


def test_a_cross_site_link_does_not_log_the_browser_out(secure: tuple[Services, str]) -> None:
    svc, url = secure
    with console(url, admin_key(svc)) as c:
        # A SameSite=Strict cookie is not sent on a navigation from another site: that request
        # arrives with no key, and its answer must not delete the key the browser holds.
        with httpx.Client(base_url=url) as navigated:
            r = navigated.get("/console/dags")
            assert r.status_code == 401
            assert not [v for v in r.headers.get_list("set-cookie") if "console_key" in v]
        assert c.get("/console/dags").status_code == 200
        # A key that is refused is dropped.
        c.cookies.set("trace_console_key", "trc_nope", path="/console")
        r = c.get("/console/dags")
        assert r.status_code == 401
        assert [v for v in r.headers.get_list("set-cookie") if "console_key=" in v]


def test_cross_site_and_origin_less_posts_are_refused(hello: tuple[Services, str, str]) -> None:
    svc, url, _ = hello
    before = len(svc.control.list_runs(admin(svc)))
    with httpx.Client(base_url=url) as attacker:
        # Login CSRF: the attacker's own token pair, from another origin, logs nobody in.
        token = csrf_of(attacker.get("/console/login"))
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Referer": "http://evil.example/page"},
        ):
            r = attacker.post(
                "/console/login", data={"key": admin_key(svc), "csrf": token}, headers=headers
            )
            assert r.status_code == 403, headers
            assert "trace_console_key" not in attacker.cookies
    with httpx.Client(base_url=url) as victim:
        # A token planted before the login (session fixation) is worth nothing after it.
        victim.cookies.set("trace_console_csrf", "planted", path="/console")
        r = victim.post("/console/login", data={"key": admin_key(svc), "csrf": "planted"})
        assert r.status_code == 303
        (fresh,) = [v for v in r.headers.get_list("set-cookie") if "console_csrf=" in v]
        fresh = fresh.split(";")[0].removeprefix("trace_console_csrf=")
        assert fresh != "planted"
    # The browser now holds the fresh token in place of the planted one.
    held = {"trace_console_key": admin_key(svc), "trace_console_csrf": fresh}
    with httpx.Client(base_url=url, cookies=held) as after:
        for token, status in (("planted", 403), (fresh, 303)):
            r = after.post("/console/dags/hello/trigger", data={"csrf": token})
            assert r.status_code == status, token
    with console(url, admin_key(svc)) as c:
        token = c.cookies.get("trace_console_csrf", path="/console") or ""
        for headers in (
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
            {"Referer": "http://evil.example/page"},
            {"Origin": f"{url}.evil.example"},
        ):
            r = c.post("/console/dags/hello/trigger", data={"csrf": token}, headers=headers)
            assert r.status_code == 403, headers
        assert len(svc.control.list_runs(admin(svc))) == before + 1
        # A same-origin page's form, and a client that sends no Origin (the token checks it).
        for headers in ({"Origin": url, "Sec-Fetch-Site": "same-origin"}, {"Referer": url + "/"}):
            r = c.post("/console/dags/hello/trigger", data={"csrf": token}, headers=headers)
            assert r.status_code == 303, headers
        assert len(svc.control.list_runs(admin(svc))) == before + 3


def test_every_console_change_is_a_post_that_checks_the_token(
    hello: tuple[Services, str, str],
) -> None:
    svc, url, run_id = hello
    # All but the catch-all, which takes every method and only answers 404 (tested above).
    routes = [
        r
        for r in api_routes(create_app(svc, background=False).routes)
        if r.path.startswith("/console") and r.path != "/console/{path:path}"
    ]
    changes = [r for r in routes if r.methods - {"GET", "HEAD"}]
    assert changes and all(r.methods == {"POST"} for r in changes)
    # Every POST reads its form through the token and origin check; no GET does.
    for r in routes:
        checked = any(d.call is form for d in r.dependant.dependencies)
        assert checked == (r in changes), r.path
    fill = {
        "name": "hello",
        "action": "trigger",
        "fmt": "csv",
        "run_id": run_id,
        "delivery_id": uuid.uuid4(),
    }
    with console(url, admin_key(svc)) as c:
        for r in changes:
            path = r.path.format(**fill)
            assert c.post(path, data={"sql": "SELECT 1"}).status_code == 403, path
    assert len(svc.control.list_runs(admin(svc))) == 1


def test_markup_in_query_results_and_chart_labels_is_text(
    secure: tuple[Services, str],
) -> None:
    svc, url = secure
    evil = "<img src=x onerror=alert(1)>"
    sql = f'SELECT \'{evil}\' AS "{evil}", 1 AS "y</title><script>alert(1)</script>"'
    with console(url, admin_key(svc)) as c:
        r = post(
            c, "/console/query", {"sql": sql, "x": evil, "y": "y</title><script>alert(1)</script>"}
        )
        assert r.status_code == 200 and "<svg" in r.text, r.text
        assert "<img" not in r.text and "<script>alert" not in r.text
        assert inline_problems(r.text) == []
        bad = post(c, "/console/query", {"sql": f'SELECT * FROM "{evil}"'})
        assert bad.status_code == 422 and "<img" not in bad.text
        # A DAG that does not validate: its problems on the deploy page, its text kept.
        yaml = f"name: '{evil}'\njobs: {{}}\n"
        refused = post(c, "/console/deploy", {"yaml": yaml, "do": "diff"})
        assert refused.status_code == 422
        assert refused.headers["content-type"].startswith("text/html")
        assert "String should match pattern" in refused.text and "<img" not in refused.text
        assert "name: &#39;&lt;img src=x onerror=alert(1)&gt;&#39;" in refused.text
        assert inline_problems(refused.text) == []


def test_deliveries_are_their_orgs_admins_and_their_payloads_are_text(
    secure: tuple[Services, str],
) -> None:
    svc, url = secure
    evil = "<img src=x onerror=alert(1)>"
    with svc.pool.connection() as conn:
        failed = add_delivery(
            conn, admin(svc).org_id, status="failed", reason=evil, rule=evil, body=evil
        )
    _, bob = user(svc, "bob")
    other = uuid.uuid4()
    with svc.pool.connection() as conn, conn.transaction():
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'other')", (other,))
        eve = create_key(conn, ensure_user(conn, other, "eve", is_admin=True).user_id)

    def status() -> str:
        with svc.pool.connection() as conn:
            row = conn.execute(
                "SELECT status FROM deliveries WHERE delivery_id = %s", (failed,)
            ).fetchone()
        assert row is not None
        return str(row["status"])

    # bob is no admin (403); to eve, an admin of another org, it does not exist (404, as on
    # its page: not the 409 of a delivery found but not failed).
    for key, refused in ((bob, 403), (eve, 404)):
        with console(url, key) as c:
            assert c.get(f"/console/deliveries/{failed}").status_code == refused
            alerts = c.get("/console/alerts")
            assert alerts.status_code == 200 and str(failed)[:8] not in alerts.text
            assert post(c, f"/console/deliveries/{failed}/retry").status_code == refused
    assert status() == "failed"
    with console(url, admin_key(svc)) as c:
        for page in (c.get(f"/console/deliveries/{failed}"), c.get("/console/alerts")):
            assert page.status_code == 200 and str(failed)[:8] in page.text
            assert "<img" not in page.text and inline_problems(page.text) == []
        assert post(c, f"/console/deliveries/{failed}/retry").status_code == 303
    assert status() == "pending"


DOWN = """
name: down
jobs:
  use: {operator: noop, inputs: [{from: {dataset: hello_clean}}], outputs: [{backend: parquet}]}
publish:
  - {job: use, output_index: 0, dataset: down_out}
"""


def test_lineage_names_only_what_the_user_may_read(hello: tuple[Services, str, str]) -> None:
    svc, url, _ = hello
    cp, me = svc.control, admin(svc)
    cp.deploy(me, DOWN)
    cp.set_deploy_roles(me, "down", ["dev"])
    _, dev = user(svc, "dev", ["dev"])
    with console(url, admin_key(svc)) as c:  # what there is to leak
        page = c.get("/console/datasets/hello_clean").text
        assert "/console/datasets/hello_raw" in page and "/console/datasets/down_out" in page
    with console(url, dev) as c:
        for path in ("/console/dags", "/console/datasets", "/console/datasets/down_out"):
            r = c.get(path)
            assert r.status_code == 200 and "down" in r.text, path
            assert "hello" not in r.text, path
        # down's graph names the dataset its spec reads (as GET /v1/dags/down shows it),
        # nothing further up.
        graph = c.get("/console/dags/down").text
        assert "hello_clean" in graph and "hello_raw" not in graph
        cp.set_read_roles(me, "hello_clean", ["dev"], [])
        down_out = c.get("/console/datasets/down_out").text
        assert "/console/datasets/hello_clean" in down_out and "hello_raw" not in down_out
        clean = c.get("/console/datasets/hello_clean").text
        assert "/console/datasets/down_out" in clean and "hello_raw" not in clean
        assert c.get("/console/datasets/hello_raw").status_code == 404
