"""The Gateway + internal API (FastAPI). Every body is a pydantic model; every error is JSON."""

from __future__ import annotations

import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any
from uuid import UUID

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from trace_platform.dispatcher import models as m
from trace_platform.dispatcher.errors import DispatcherError, Unauthorized
from trace_platform.dispatcher.reaper import run_reaper
from trace_platform.services import Services

MAX_BODY_BYTES = 2 * 1024 * 1024


def _error(
    status: int, code: str, message: str, detail: dict[str, Any] | None = None
) -> JSONResponse:
    body = {"error": code, "message": message, "detail": detail or {}}
    return JSONResponse(jsonable_encoder(body), status_code=status)


def create_app(services: Services, *, background: bool = True) -> FastAPI:
    """`background` runs the outbox publisher and reaper loops inside this process."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if background:
            s = services.settings
            threads.extend(
                [
                    threading.Thread(
                        target=services.publisher.run,
                        args=(stop, services.dsn, s.queue_poll_seconds),
                        name="outbox-publisher",
                        daemon=True,
                    ),
                    threading.Thread(
                        target=run_reaper,
                        args=(services.dispatcher, stop, s.reaper_interval_seconds),
                        name="reaper",
                        daemon=True,
                    ),
                ]
            )
            for t in threads:
                t.start()
        yield
        stop.set()
        for t in threads:
            t.join(timeout=5)

    app = FastAPI(title="Trace", version="0.1.0", lifespan=lifespan)
    d = services.dispatcher

    @app.middleware("http")
    async def limit_body(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            return _error(
                413, "too_large", f"request body is {length} bytes; the limit is {MAX_BODY_BYTES}"
            )
        return await call_next(request)

    @app.exception_handler(DispatcherError)
    async def dispatcher_error(_: Request, exc: DispatcherError) -> JSONResponse:
        return _error(exc.status_code, exc.code, exc.message, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"])
            problems.append(f"{where}: {e['msg']}")
        return _error(422, "invalid_request", "; ".join(problems), {"errors": problems})

    def internal_auth(authorization: Annotated[str | None, Header()] = None) -> None:
        token = services.settings.internal_token
        if token is None:
            return
        expected = f"Bearer {token.get_secret_value()}"
        if authorization is None or not secrets.compare_digest(authorization, expected):
            raise Unauthorized("internal endpoints need the platform's internal token")

    internal = [Depends(internal_auth)]

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        with services.pool.connection() as conn:
            conn.execute("SELECT 1")
        return {"ok": True, "outbox_pending": services.publisher.pending()}

    # -- internal: the worker wrapper only -----------------------------------------------
    @app.post("/internal/claim", dependencies=internal)
    def claim(body: m.ClaimRequest) -> m.Claim:
        return d.claim(body)

    @app.get("/internal/task-fetch", dependencies=internal)
    def task_fetch(
        task_id: UUID,
        attempt: Annotated[int, Query(gt=0)],
        x_lease_token: Annotated[UUID, Header()],
    ) -> m.TaskPayload:
        return d.fetch(m.LeaseRef(task_id=task_id, attempt=attempt, lease_token=x_lease_token))

    @app.post("/internal/heartbeat", dependencies=internal)
    def heartbeat(body: m.HeartbeatRequest) -> m.HeartbeatResponse:
        return d.heartbeat(body)

    @app.post("/internal/events", dependencies=internal)
    def events(body: m.EventsRequest) -> m.EventsResponse:
        return d.events(body)

    @app.post("/internal/task-complete", dependencies=internal)
    def task_complete(body: m.CompleteRequest) -> m.CompleteResponse:
        return d.complete(body)

    # -- user-facing ----------------------------------------------------------------------
    @app.post("/v1/tasks", status_code=201)
    def create_task(body: m.TaskSpec) -> m.TaskRef:
        return d.create_task(body)

    @app.get("/v1/tasks")
    def list_tasks(limit: Annotated[int, Query(gt=0, le=1000)] = 50) -> list[dict[str, Any]]:
        return d.list_tasks(limit)

    @app.get("/v1/tasks/{task_id}")
    def get_task(task_id: UUID) -> m.TaskView:
        return d.get_task(task_id)

    @app.post("/v1/tasks/{task_id}/cancel")
    def cancel_task(task_id: UUID) -> m.CancelResponse:
        return d.cancel(task_id)

    return app
