"""The Gateway + internal API (FastAPI). Every body is a pydantic model; every error is JSON.

`create_app` only assembles: the lifespan's background loops (`api/background.py`), the
middleware and error handlers (`api/gateway.py`, `api/errors.py`), who is calling
(`api/auth.py`), and one router per responsibility (`api/routes/`)."""

from __future__ import annotations

from fastapi import FastAPI

from trace_platform import console
from trace_platform.api import background as bg
from trace_platform.api.audit_source import AuditSource
from trace_platform.api.auth import actor_dependency
from trace_platform.api.errors import LastResort, install_error_handlers
from trace_platform.api.gateway import MAX_BODY_BYTES, BodyLimit, InternalToken, TraceRoute
from trace_platform.api.routes import (
    audit,
    dags,
    datasets,
    delivery,
    health,
    identity,
    internal,
    names,
    query,
    runs,
    secrets,
    tasks,
    workers,
)
from trace_platform.metrics.api import ApiMetrics
from trace_platform.metrics.http import RequestTimer
from trace_platform.services import Services


def create_app(services: Services, *, background: bool = True) -> FastAPI:
    """`background` runs the outbox publisher and reaper loops inside this process."""
    app = FastAPI(
        title="Trace", version="0.1.0", lifespan=bg.lifespan(services, background=background)
    )
    # Every route checks its names and parses JSON bodies with bounds (api/gateway.py): the
    # routers are made with TraceRoute (routes.trace_router), and so is anything added here.
    app.router.route_class = TraceRoute

    token = services.internal_token
    if not token:  # never serve /internal/* unauthenticated
        raise RuntimeError("the API needs an internal token to serve /internal/*")

    # Outermost first: anything unexpected is a logged 500 in Trace's shape; /internal/*
    # without the token is refused unread (the only check of it); bodies are counted as they stream (413 at the
    # limit). Every other error is mapped by install_error_handlers.
    _guard(app, token)
    # Outermost of all: each request's latency by route template (metrics/http.py), served
    # with the rest of the process's metrics on TRACE_METRICS_PORT (the lifespan's).
    app.state.metrics = metrics = ApiMetrics(services)
    app.add_middleware(RequestTimer, histogram=metrics.requests)

    # internal: the worker wrapper only (the InternalToken middleware); first, as the most
    # called (routes are matched in order)
    app.include_router(internal.router(services))
    app.include_router(health.router(services))
    # user-facing: every call acts as a user
    actor = actor_dependency(services)
    for routes in (
        tasks,
        dags,
        runs,
        datasets,
        names,
        query,
        secrets,
        delivery,
        workers,
        identity,
        audit,
    ):
        app.include_router(routes.router(services, actor))
    console.mount(app, services, actor)  # /console: the web console, the same users and checks
    return app


def create_hooks_app(services: Services) -> FastAPI:
    """The named webhooks alone (`POST /v1/hooks/{dag}/{trigger}`), behind the same checks,
    users and error answers as in `create_app`: what the API Gateway entry serves
    (aws/apigateway.py). No other route, no OpenAPI pages, no background loops."""
    app = FastAPI(title="Trace webhooks", openapi_url=None, docs_url=None, redoc_url=None)
    app.router.route_class = TraceRoute
    _guard(app, None)
    app.include_router(dags.hooks_router(services, actor_dependency(services)))
    return app


def _guard(app: FastAPI, token: str | None) -> None:
    """Every app's middleware (outermost last) and error handlers; /internal/* is guarded by
    `token` where the app serves it."""
    app.add_middleware(AuditSource)  # innermost: errors answered outside it keep their shape
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    if token is not None:
        app.add_middleware(InternalToken, token=token)
    app.add_middleware(LastResort)
    install_error_handlers(app)
