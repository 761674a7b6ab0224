"""The web console end to end: headless Chromium (Debian's `chromium`, driven by Playwright
with `executable_path`, never a downloaded browser) against a running Lite stack with a real
worker. Log in, trigger a DAG and watch its tree finish live (server-sent events, no reload),
open a dataset and its versions, deploy an edit, watch the rebuild, cut over and roll back, run
a query with a chart and export it as CSV; a reader of nothing sees none of it. Screenshots go
to the test's tmp_path (`screenshots/`); no page may log a browser console error."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.dags import admin, three_jobs, user
from tests.support.sandbox import bind_env, record_dir
from tests.support.servers import admin_key
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.lite.stack import LiteStack

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(
        "headless Chromium is absent: install Debian's package "
        "(apt-get install -y --no-install-recommends chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (dev extra) is absent")


@pytest.fixture
def stack(settings: Settings, dsn: str, tmp_path: Path) -> Iterator[LiteStack]:
    s = LiteStack(
        settings,
        workers=1,
        dsn=dsn,
        worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2", **bind_env(tmp_path)},
    )
    s.start()
    yield s
    s.stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        # --no-sandbox: the tests run as root, where Chromium's own sandbox refuses to start.
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


def rebuilt(svc: Any) -> bool:
    status = svc.control.changes.status(admin(svc), "hello")
    return "rebuild" in status and status["rebuild"]["blocked_by"] is None


class Session:
    """A browser page logged in to the console, recording console errors and screenshots."""

    def __init__(self, browser: Any, url: str, key: str, shots: Path) -> None:
        self.context = browser.new_context(accept_downloads=True)
        self.page = self.context.new_page()
        self.url, self.shots, self.errors = url, shots, []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: d.accept())  # the confirm() before each change
        self.page.goto(f"{url}/console/login")
        self.page.get_by_label("API key").fill(key)
        self.page.get_by_role("button", name="Log in").click()
        self.page.wait_for_url("**/console/dags")

    def go(self, path: str) -> Any:
        self.page.goto(self.url + path)
        return self.page

    def shot(self, name: str) -> None:
        self.shots.mkdir(exist_ok=True)
        self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)


def test_the_console_drives_a_lite_stack(stack: LiteStack, browser: Any, tmp_path: Path) -> None:
    svc = stack.services
    svc.control.deploy(admin(svc), three_jobs(record=str(record_dir(tmp_path) / "sinks.txt")))
    s = Session(browser, stack.url, admin_key(svc), tmp_path / "screenshots")
    page, expect = s.page, sync_api.expect
    s.shot("dags")

    # Trigger from the DAG page; the run page's tree fills in over SSE until the run is done.
    s.go("/console/dags/hello").get_by_role("button", name="Trigger a run").click()
    page.wait_for_url("**/console/runs/*")
    tree = page.locator("#tree")
    expect(tree).to_have_attribute("data-live", "done", timeout=120_000)  # set by the stream
    expect(tree.locator(".summary")).to_have_attribute("data-status", "succeeded")
    expect(tree.locator(".task")).to_have_count(7)  # source, 3 transforms, 3 sinks
    s.shot("run")

    # A dataset, its producer and versions.
    s.go("/console/datasets").get_by_role("link", name="hello_raw").click()
    expect(page.get_by_role("heading", name="Dataset hello_raw")).to_be_visible()
    expect(page.locator("table.versions tbody tr.current")).to_have_count(1)
    expect(page.get_by_role("link", name="hello_clean")).to_be_visible()  # downstream
    s.shot("dataset")

    # Deploy an edit: its diff first, then the rebuild beside the live version, cut over by
    # hand once complete, then rolled back.
    s.go("/console/deploy?dag=hello")
    text = page.get_by_label("DAG YAML").input_value()
    page.get_by_label("DAG YAML").fill(text.replace("count: 1", "count: 2", 1))
    page.get_by_role("button", name="Show what it changes").click()
    expect(page.get_by_role("heading", name="What deploying hello would do")).to_be_visible()
    s.shot("deploy-diff")
    page.get_by_label("Cut over by hand").check()
    page.get_by_role("button", name="Deploy", exact=True).click()
    page.wait_for_url("**/console/dags/hello")
    expect(page.get_by_role("heading", name="Rebuild of version 2")).to_be_visible()
    wait_for(lambda: rebuilt(svc), 120, "the rebuild of version 2 to complete")
    # No reload: the rebuild panel is live, its cutover button enabled once nothing blocks.
    expect(page.get_by_text("Complete: ready to cut over")).to_be_visible()
    expect(page.get_by_role("button", name="Cut over to version 2")).to_be_enabled()
    s.shot("rebuild")
    page.get_by_role("button", name="Cut over to version 2").click()
    expect(page.get_by_role("status")).to_have_text("cut over to version 2")
    page.get_by_role("button", name="Roll back").click()
    expect(page.get_by_role("status")).to_have_text("rolled back: version 1")
    s.shot("rolled-back")

    # A query, its chart and its CSV (over values: the test operators commit no rows).
    s.go("/console/query")
    page.get_by_label("SQL").fill("SELECT * FROM (VALUES ('a', 1), ('b', 3)) AS t(k, n)")
    page.get_by_label("x column").fill("k")
    page.get_by_label("y column").fill("n")
    with page.expect_navigation(timeout=120_000):  # the query's answer is the next page
        page.get_by_role("button", name="Run").click()
    expect(page.locator("table.results tbody tr")).to_have_count(2)
    expect(page.locator("svg.chart rect.bar")).to_have_count(2)
    s.shot("query")
    with page.expect_download() as got:
        page.get_by_role("button", name="Export CSV").click()
    csv = Path(got.value.path()).read_text()
    assert csv.replace('"', "").splitlines() == ["k,n", "a,1", "b,3"]
    assert s.errors == []

    # A user without roles sees none of it, through the browser too.
    _, bob_key = user(svc, "bob")
    bob = Session(browser, stack.url, bob_key, tmp_path / "screenshots")
    expect(bob.go("/console/dags").get_by_text("No DAGs you may see.")).to_be_visible()
    assert "hello" not in bob.page.content()
    bob.go("/console/datasets/hello_raw")
    expect(bob.page.get_by_role("alert")).to_contain_text("no dataset named 'hello_raw'")
    bob.shot("no-role")
    # The refusal page is a 404 document: the only console error Chromium logs is its status.
    assert all("404" in e for e in bob.errors), bob.errors
