"""The web console, served by the API process under /console (docs/console.md).

Server-rendered pages (Jinja2) over the same control plane, Query Service and delivery calls
as the HTTP API's routes, as the user an API key names (checked by the API's own
`actor_dependency`); a small local script for the live run tree (server-sent events). Every
asset is served from this package: nothing from a CDN, nothing inline."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

from trace_platform.api.auth import ActorDependency
from trace_platform.console import analytics, dags, data, runs
from trace_platform.console.web import (
    SECURITY_HEADERS,
    ConsoleRoute,
    form,
    log_in,
    log_out,
    render,
    user_of,
)
from trace_platform.errors import Invalid, NotFound
from trace_platform.services import Services


def mount(app: FastAPI, services: Services, actor: ActorDependency) -> None:
    """Adds the console's pages and its static files to the API's app."""
    user = user_of(actor)
    app.include_router(_session(actor))
    for pages in (dags, runs, data, analytics):
        app.include_router(pages.router(services, user))
    static = StaticFiles(directory=str(files("trace_platform.console") / "static"))
    app.mount("/console/static", _Headers(static), name="console-static")
    app.include_router(_nowhere())  # last: after every page and the static files


def _nowhere() -> APIRouter:
    """Any other /console path, or a page asked with a method it does not take: the console's
    own 404 page, not the API's JSON (or Starlette's plain-text 405)."""
    r = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

    @r.api_route("/console/{path:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
    def nowhere(path: str) -> Response:
        raise NotFound(f"no page /console/{path}")

    return r


def _session(actor: ActorDependency) -> APIRouter:
    r = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

    @r.get("/console")
    @r.get("/console/")
    def home() -> RedirectResponse:
        return RedirectResponse("/console/dags", status_code=303)

    @r.get("/console/login")
    def login_page(request: Request) -> Response:
        return render(request, "login.html", error=None)

    @r.post("/console/login")
    def login(request: Request, fields: dict[str, str] = Depends(form)) -> Response:
        key = fields.get("key", "").strip()
        if not key:
            raise Invalid("give an API key")
        actor(authorization=f"Bearer {key}")  # 401 (the login page again) unless it is valid
        return log_in(request, key)

    @r.post("/console/logout")
    def logout(request: Request, _: dict[str, str] = Depends(form)) -> Response:
        return log_out(request)

    return r


class _Headers:
    """The console's security headers on its static files too."""

    def __init__(self, app: StaticFiles) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + [
                    (k.lower().encode(), v.encode())
                    for k, v in SECURITY_HEADERS.items()
                    if k != "Cache-Control"
                ]
            await send(message)

        await self.app(scope, receive, send_with_headers)
