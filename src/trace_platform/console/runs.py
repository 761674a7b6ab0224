"""Console pages of runs: the list, a run's task tree, and the tree live: a server-sent event
stream that re-renders the tree partial from the control plane's `show_run` (what `GET
/v1/runs/{id}` answers) every POLL_SECONDS and sends it when it changed. Cancel and "run
again" are the control plane's `cancel_run` and `trigger`."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from trace_platform.console.web import ConsoleRoute, form, redirect, render, templates
from trace_platform.control.service import run_status
from trace_platform.errors import TraceError
from trace_platform.identity import Actor
from trace_platform.services import Services

POLL_SECONDS = 0.5
# Live streams held open at once, by one user and by everyone: each polls Postgres on the
# request thread pool the API's routes and its workers' heartbeats share, so streams opened
# by the hundred would starve them. Past either, 429 (a browser's EventSource then stops).
STREAMS_PER_USER = 4
STREAMS_TOTAL = 32
# A stream ends after this long; the browser's EventSource reconnects by itself, so no
# connection outlives a server's graceful shutdown by much.
STREAM_SECONDS = 120.0
ACTIVE = ("queued", "running", "buffered")


def tree(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tasks nested under their parents (roots: no parent in this run), oldest first."""
    ordered = sorted(tasks, key=lambda t: (t["created_at"], str(t["task_id"])))
    ids = {t["task_id"] for t in ordered}
    nodes = {t["task_id"]: {**t, "children": []} for t in ordered}
    roots = []
    for t in ordered:
        parent = t["parent_task_id"]
        if parent in ids:
            nodes[parent]["children"].append(nodes[t["task_id"]])
        else:
            roots.append(nodes[t["task_id"]])
    return roots


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """Counts by status, and the run's status as the API's run list says it."""
    counts: dict[str, int] = {}
    for t in run["tasks"]:
        counts[t["status"]] = counts.get(t["status"], 0) + 1
    active = sum(n for s, n in counts.items() if s in ACTIVE)
    zero = dict.fromkeys(("failed", "succeeded", "canceled"), 0)
    status = run_status({**zero, **counts, "active": active, "tasks": len(run["tasks"])})
    return {"counts": sorted(counts.items()), "status": status, "finished": not active}


class TooManyStreams(TraceError):
    status_code = 429
    code = "too_many_streams"


def sse_event(name: str, text: str) -> str:
    """One server-sent event: a data line per line of `text`. A line ends at CR, LF or CR LF
    for the browser, so each is split here: a CR in a task's error (any text its code raised)
    must not end the data and start a field of its own (a forged `done` or `tree`)."""
    return f"event: {name}\n" + "".join(f"data: {ln}\n" for ln in _LINES.split(text)) + "\n"


_LINES = re.compile(r"\r\n|\r|\n")


class _Slots:
    """Who holds live streams, counted on the event loop's thread."""

    def __init__(self) -> None:
        self.held: dict[UUID, int] = {}

    def take(self, me: Actor) -> Callable[[], None]:
        mine = self.held.get(me.user_id, 0)
        if mine >= STREAMS_PER_USER:
            raise TooManyStreams(
                f"you have {mine} live streams open (at most {STREAMS_PER_USER}): close a run's "
                "page, or reload this one later"
            )
        if sum(self.held.values()) >= STREAMS_TOTAL:
            raise TooManyStreams("the console has as many live streams open as it serves")
        self.held[me.user_id] = mine + 1

        def give_back() -> None:
            left = self.held[me.user_id] - 1
            if left:
                self.held[me.user_id] = left
            else:
                del self.held[me.user_id]

        return give_back


class _Stream(StreamingResponse):
    """A stream that gives its slot back however it ends (finished, the client gone, an
    error)."""

    def __init__(self, events: AsyncIterator[str], give_back: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        self.give_back = give_back

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.give_back()


def tree_html(run: dict[str, Any]) -> str:
    return templates.get_template("run_tree.html").render(
        run=run, roots=tree(run["tasks"]), summary=summary(run)
    )


def router(services: Services, user: Callable[..., Actor]) -> APIRouter:
    cp = services.control
    r = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

    @r.get("/console/runs")
    def run_list(request: Request, me: Actor = Depends(user), dag: str | None = None) -> Any:
        return render(request, "runs.html", me=me, runs=cp.list_runs(me, dag, 100), dag=dag)

    @r.get("/console/runs/{run_id}")
    def run_page(request: Request, run_id: UUID, me: Actor = Depends(user)) -> HTMLResponse:
        run = cp.show_run(me, run_id)
        return render(request, "run.html", me=me, run=run, tree=tree_html(run))

    slots = _Slots()

    def snapshot(me: Actor | None, request: Request, run_id: UUID) -> tuple[str, bool, float]:
        """The run's tree as HTML, whether it is finished, and the seconds this took: read
        and rendered on a pool thread, never the event loop (a tree of 10,000 tasks takes
        ~0.4 s to render, which on the loop would stall every request of the process). The
        key is checked again at each poll (the API's cached check: a revocation, an expiry or
        a changed role announced by the database ends the stream at once)."""
        t0 = time.monotonic()
        run = cp.show_run(me or user(request), run_id)
        return tree_html(run), summary(run)["finished"], time.monotonic() - t0

    @r.get("/console/runs/{run_id}/events")
    async def run_events(request: Request, run_id: UUID, me: Actor = Depends(user)) -> Any:
        # Seen before the stream starts: a run the user may not see is the API's 404 page.
        first = await run_in_threadpool(snapshot, me, request, run_id)
        give_back = slots.take(me)

        async def events() -> AsyncIterator[str]:
            (html, finished, took), last = first, ""
            until = time.monotonic() + STREAM_SECONDS
            while time.monotonic() < until and not await request.is_disconnected():
                if html != last:
                    last = html
                    yield sse_event("tree", html)
                if finished:
                    yield sse_event("done", "finished")
                    return
                # A big run is polled less often: at most a fifth of a thread's time each.
                await asyncio.sleep(max(POLL_SECONDS, 4 * took))
                try:
                    html, finished, took = await run_in_threadpool(snapshot, None, request, run_id)
                except TraceError as e:  # e.g. its key revoked meanwhile: the stream ends
                    yield sse_event("done", e.message)
                    return

        return _Stream(events(), give_back)

    @r.post("/console/runs/{run_id}/cancel")
    def run_cancel(
        request: Request,
        run_id: UUID,
        me: Actor = Depends(user),
        _: dict[str, str] = Depends(form),
    ) -> RedirectResponse:
        res = cp.cancel_run(me, run_id)
        return redirect(request, f"/runs/{run_id}", f"canceled {res['canceled']} task(s)")

    @r.post("/console/runs/{run_id}/again")
    def run_again(
        request: Request,
        run_id: UUID,
        me: Actor = Depends(user),
        _: dict[str, str] = Depends(form),
    ) -> RedirectResponse:
        """A new run of the same DAG with the same config (a failed run's retry)."""
        run = cp.show_run(me, run_id)
        new = cp.trigger(me, run["dag"], config=run.get("config") or None)
        return redirect(request, f"/runs/{new['run_id']}", "triggered again")

    return r
