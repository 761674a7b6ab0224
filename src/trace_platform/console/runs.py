"""Console pages of runs: the list, a run's task tree, and the tree live: a server-sent event
stream (console/live.py) that re-renders the tree partial from the control plane's `show_run`
(what `GET /v1/runs/{id}` answers) and sends it when it changed. A run's buttons (one action
table): cancel, retry failed tasks and run again are the control plane's `cancel_run`,
`retry_run` and `trigger`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from trace_platform.console import live
from trace_platform.console.web import ConsoleRoute, form, redirect, render, templates
from trace_platform.control.service import run_status
from trace_platform.errors import NotFound
from trace_platform.identity import Actor
from trace_platform.services import Services

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

    def snapshot(me: Actor, run_id: UUID) -> live.Snapshot:
        run = cp.show_run(me, run_id)
        return tree_html(run), "finished" if summary(run)["finished"] else None

    @r.get("/console/runs/{run_id}/events")
    async def run_events(request: Request, run_id: UUID, me: Actor = Depends(user)) -> Any:
        return await live.stream(request, me, user, lambda who: snapshot(who, run_id), "tree")

    # What each button of a run's page does: the control plane's call, then where to go and
    # what to say there.
    def cancel(me: Actor, run_id: UUID) -> tuple[str, str]:
        res = cp.cancel_run(me, run_id)
        return f"/runs/{run_id}", f"canceled {res['canceled']} task(s)"

    def retry(me: Actor, run_id: UUID) -> tuple[str, str]:
        """The run's failed tasks queued again (the control plane's `retry_run`)."""
        return f"/runs/{run_id}", cp.retry_run(me, run_id)["message"]

    def again(me: Actor, run_id: UUID) -> tuple[str, str]:
        """A new run of the same DAG with the same config (a failed run's retry)."""
        run = cp.show_run(me, run_id)
        new = cp.trigger(me, run["dag"], config=run.get("config") or None)
        return f"/runs/{new['run_id']}", "triggered again"

    actions: dict[str, Callable[[Actor, UUID], tuple[str, str]]] = {
        "cancel": cancel,
        "retry": retry,
        "again": again,
    }

    @r.post("/console/runs/{run_id}/{action}")
    def run_action(
        request: Request,
        run_id: UUID,
        action: str,
        me: Actor = Depends(user),
        _: dict[str, str] = Depends(form),
    ) -> RedirectResponse:
        act = actions.get(action)
        if act is None:
            raise NotFound(f"no action '{action}'")
        return redirect(request, *act(me, run_id))

    return r
