"""Console pages of DAGs: the list, a DAG's graph, versions and their diff, the live rebuild,
and the safe-change buttons (deploy with its diff first, cutover, rollback, pause, resume,
trigger). The rebuild panel is live: a server-sent event stream (console/live.py) re-renders it
from `changes.status` while the rebuild it follows is in flight. Every read and change is the control plane's, as `/v1/dags` calls it: who may not
see a DAG gets the API's not-found, who may not change it the API's refusal."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import yaml
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from trace_platform.console import live
from trace_platform.console.svg import dag_graph, graph_svg
from trace_platform.console.web import (
    CSRF_COOKIE,
    PREFIX,
    ConsoleRoute,
    form,
    redirect,
    render,
    templates,
)
from trace_platform.control.changes import plan_json
from trace_platform.dag.validate import DagInvalid
from trace_platform.errors import Invalid, NotFound
from trace_platform.identity import Actor
from trace_platform.services import Services


def _spec_text(spec: dict[str, Any]) -> list[str]:
    return yaml.safe_dump(spec, sort_keys=True).splitlines()


def _ended(status: dict[str, Any], followed: int | None) -> str | None:
    """Why a stream following the rebuild of version `followed` stops (None: it goes on)."""
    building = status["building_version"]
    if followed is None:
        return "No rebuild in flight."
    if building == followed:
        return None
    if building is not None:
        return f"Superseded by the rebuild of version {building}."
    if status["active_version"] == followed:
        return f"Cut over to version {followed}."
    return f"The rebuild of version {followed} was abandoned (a rollback or a newer deploy)."


def router(services: Services, user: Callable[..., Actor]) -> APIRouter:
    cp = services.control
    r = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

    @r.get("/console/dags")
    def dag_list(request: Request, me: Actor = Depends(user)) -> HTMLResponse:
        return render(
            request,
            "dags.html",
            me=me,
            dags=cp.list_dags(me),
            runs=cp.list_runs(me, None, 20),
        )

    @r.get("/console/dags/{name}")
    def dag_page(
        request: Request,
        name: str,
        me: Actor = Depends(user),
        a: int | None = None,
        b: int | None = None,
    ) -> HTMLResponse:
        listed = next((d for d in cp.list_dags(me) if d["name"] == name), None)
        if listed is None:  # the API's answer for a DAG the user may not see
            raise NotFound(f"no DAG named '{name}'")
        context: dict[str, Any] = {"me": me, "dag": listed, "name": name}
        if listed["can_deploy"]:  # the spec, runs and rollout: deployers' and admins' only
            shown = cp.show_dag(me, name)
            status = cp.changes.status(me, name)
            nodes, edges = dag_graph(shown["spec"])
            context |= {
                "shown": shown,
                "status": status,
                "graph": graph_svg(nodes, edges, f"DAG {name}: jobs and datasets"),
                "runs": cp.list_runs(me, name, 20),
                "diff": _diff(me, name, a, b) if a and b else None,
                "a": a,
                "b": b,
            }
        context["datasets"] = [d for d in cp.list_datasets(me) if d["producer_dag"] == name]
        return render(request, "dag.html", **context)

    def _diff(me: Actor, name: str, a: int, b: int) -> list[str]:
        old = cp.show_dag(me, name, a)["spec"]
        new = cp.show_dag(me, name, b)["spec"]
        return list(
            difflib.unified_diff(
                _spec_text(old), _spec_text(new), f"version {a}", f"version {b}", lineterm=""
            )
        )

    @r.get("/console/dags/{name}/rebuild/events")
    async def rebuild_events(request: Request, name: str, me: Actor = Depends(user)) -> Any:
        followed: list[int | None] = []  # the version building at the first read

        def read(who: Actor) -> live.Snapshot:
            # The page's own call: a DAG the user may not deploy is the API's 404.
            status = cp.changes.status(who, name)
            building = status["building_version"]
            if not followed:
                followed.append(building)
            ended = _ended(status, followed[0])
            html = templates.get_template("dag_rebuild.html").render(
                prefix=PREFIX,
                csrf=request.cookies.get(CSRF_COOKIE, ""),
                name=name,
                status=status,
                ended=ended,
            )
            return html, ended

        return await live.stream(request, me, user, read, "rebuild")

    @r.post("/console/dags/{name}/{action}")
    def dag_action(
        request: Request,
        name: str,
        action: str,
        me: Actor = Depends(user),
        fields: dict[str, str] = Depends(form),
    ) -> RedirectResponse:
        if action == "trigger":
            run = cp.trigger(me, name)
            return redirect(request, f"/runs/{run['run_id']}", "triggered")
        if action == "pause":
            cp.changes.set_paused(me, name, True)
        elif action == "resume":
            cp.changes.set_paused(me, name, False)
        elif action == "cutover":
            res = cp.changes.cutover(me, name)
            return redirect(request, f"/dags/{name}", f"cut over to version {res['version']}")
        elif action == "rollback":
            to = fields.get("to") or None
            if to is not None and not to.isdigit():
                raise Invalid("a rollback goes to a version number")
            res = cp.changes.rollback(me, name, int(to) if to else None)
            return redirect(request, f"/dags/{name}", f"rolled back: version {res['version']}")
        else:
            raise NotFound(f"no action '{action}'")
        return redirect(request, f"/dags/{name}", f"{action}d")

    @r.get("/console/deploy")
    def deploy_form(request: Request, me: Actor = Depends(user), dag: str = "") -> HTMLResponse:
        text = ""
        if dag:  # start from the live spec of a DAG the user may change
            text = yaml.safe_dump(cp.show_dag(me, dag)["spec"], sort_keys=False)
        return render(request, "deploy.html", me=me, text=text, plan=None)

    @r.post("/console/deploy", response_model=None)
    def deploy(
        request: Request,
        me: Actor = Depends(user),
        fields: dict[str, str] = Depends(form),
    ) -> HTMLResponse | RedirectResponse:
        """`diff` shows what a deploy would change (dry run), `deploy` deploys."""
        text = fields.get("yaml", "")
        dry = fields.get("do") != "deploy"
        try:
            res = cp.deploy(me, text, "<console>", dry_run=dry, manual_cutover="manual" in fields)
        except DagInvalid as e:  # every problem beside the text, kept to be fixed
            return render(request, "deploy.html", 422, me=me, text=text, plan=None, error=str(e))
        plan = plan_json(res)
        if not dry:
            return redirect(request, f"/dags/{res.name}", f"deployed version {res.version}")
        return render(request, "deploy.html", me=me, text=text, plan=plan)

    return r
