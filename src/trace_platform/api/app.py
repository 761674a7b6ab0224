"""The Gateway + internal API (FastAPI). Every body is a pydantic model; every error is JSON."""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import Depends, FastAPI, Header, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from trace_platform.api.errors import LastResort, install_error_handlers
from trace_platform.api.gateway import MAX_BODY_BYTES, BodyLimit, InternalToken, TraceRoute
from trace_platform.contract import (
    Claim,
    ClaimRequest,
    CompleteRequest,
    CompleteResponse,
    EventsRequest,
    EventsResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRef,
    TaskPayload,
    TaskRef,
    TaskSpec,
)
from trace_platform.dispatcher.models import CancelResponse, TaskView
from trace_platform.dispatcher.reaper import run_reaper
from trace_platform.errors import Unauthorized
from trace_platform.identity import Actor, authenticate, lite_admin
from trace_platform.query import formats, saved
from trace_platform.services import Services
from trace_platform.triggers.cron import run_scheduler


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
                    threading.Thread(
                        target=run_scheduler,
                        args=(services.dispatcher, stop, s.scheduler_interval_seconds),
                        name="scheduler",
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
    # Every route checks its names and parses JSON bodies with bounds (api/gateway.py); set
    # before any route is added.
    app.router.route_class = TraceRoute
    d = services.dispatcher

    token = services.internal_token
    if not token:  # never serve /internal/* unauthenticated
        raise RuntimeError("the API needs an internal token to serve /internal/*")

    # Outermost first: anything unexpected is a logged 500 in Trace's shape; /internal/*
    # without the token is refused unread; bodies are counted as they stream (413 at the
    # limit). Every other error is mapped by install_error_handlers.
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    app.add_middleware(InternalToken, token=token)
    app.add_middleware(LastResort)
    install_error_handlers(app)

    def internal_auth(x_internal_token: Annotated[str | None, Header()] = None) -> None:
        if x_internal_token is None or not secrets.compare_digest(
            x_internal_token.encode(), token.encode()
        ):
            raise Unauthorized("internal endpoints need the platform's internal token")

    internal = [Depends(internal_auth)]

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        with services.pool.connection() as conn:
            conn.execute("SELECT 1")
        return {"ok": True, "outbox_pending": services.publisher.pending()}

    # -- internal: the worker wrapper only -----------------------------------------------
    @app.post("/internal/claim", dependencies=internal)
    def claim(body: ClaimRequest) -> Claim:
        return d.claim(body)

    @app.get("/internal/task-fetch", dependencies=internal)
    def task_fetch(
        task_id: UUID,
        attempt: Annotated[int, Query(gt=0)],
        x_lease_token: Annotated[UUID, Header()],
    ) -> TaskPayload:
        return d.fetch(LeaseRef(task_id=task_id, attempt=attempt, lease_token=x_lease_token))

    @app.get("/internal/task-secrets", dependencies=internal)
    def task_secrets(
        task_id: UUID,
        attempt: Annotated[int, Query(gt=0)],
        x_lease_token: Annotated[UUID, Header()],
    ) -> dict[str, str]:
        return d.secrets(LeaseRef(task_id=task_id, attempt=attempt, lease_token=x_lease_token))

    @app.post("/internal/heartbeat", dependencies=internal)
    def heartbeat(body: HeartbeatRequest) -> HeartbeatResponse:
        return d.heartbeat(body)

    @app.post("/internal/events", dependencies=internal)
    def events(body: EventsRequest) -> EventsResponse:
        return d.events(body)

    @app.post("/internal/task-complete", dependencies=internal)
    def task_complete(body: CompleteRequest) -> CompleteResponse:
        return d.complete(body)

    # -- user-facing: every call acts as a user ---------------------------------------------
    def actor(authorization: Annotated[str | None, Header()] = None) -> Actor:
        key = authorization.removeprefix("Bearer ").strip() if authorization else None
        with services.pool.connection() as conn:
            found = authenticate(conn, key)
            if found is not None:
                return found
            if key is None and services.settings.auth == "permissive":
                return lite_admin(conn)
        raise Unauthorized(
            "an API key is required (Authorization: Bearer <key>)"
            if key is None
            else "unknown or revoked API key"
        )

    cp = services.control

    @app.post("/v1/tasks", status_code=201)
    def create_task(body: TaskSpec, user: Actor = Depends(actor)) -> TaskRef:
        return cp.create_task(user, body)

    @app.get("/v1/tasks")
    def list_tasks(
        user: Actor = Depends(actor), limit: Annotated[int, Query(gt=0, le=1000)] = 50
    ) -> list[dict[str, Any]]:
        return cp.list_tasks(user, limit)

    @app.get("/v1/tasks/{task_id}")
    def get_task(task_id: UUID, user: Actor = Depends(actor)) -> TaskView:
        return cp.get_task(user, task_id)

    @app.post("/v1/tasks/{task_id}/cancel")
    def cancel_task(task_id: UUID, user: Actor = Depends(actor)) -> CancelResponse:
        return cp.cancel_task(user, task_id)

    @app.post("/v1/dags", status_code=201)
    def deploy_dag(body: DeployBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        res = cp.deploy(user, body.yaml, body.source or "<request>")
        return {
            "dag_id": res.dag_id,
            "name": res.name,
            "version": res.version,
            "created": res.created,
            "rebuilt_jobs": res.rebuilt_jobs,
            "datasets": res.datasets,
        }

    @app.get("/v1/dags")
    def list_dags(user: Actor = Depends(actor)) -> list[dict[str, Any]]:
        return cp.list_dags(user)

    @app.get("/v1/dags/{name}")
    def show_dag(
        name: str, user: Actor = Depends(actor), version: int | None = None
    ) -> dict[str, Any]:
        return cp.show_dag(user, name, version)

    @app.post("/v1/dags/{name}/trigger", status_code=201)
    def trigger_dag(
        name: str,
        user: Actor = Depends(actor),
        body: TriggerBody | None = None,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> dict[str, Any]:
        return cp.trigger(
            user, name, fire_key=idempotency_key, config=body.config if body else None
        )

    @app.post("/v1/hooks/{dag}/{trigger}", status_code=201)
    def webhook(
        dag: str,
        trigger: str,
        user: Actor = Depends(actor),
        body: dict[str, Any] | None = None,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> dict[str, Any]:
        """A named webhook: the same durable intent + outbox path as cron and manual runs."""
        return cp.trigger(
            user, dag, trigger=trigger, kind="webhook", fire_key=idempotency_key, config=body or {}
        )

    @app.get("/v1/runs")
    def list_runs(
        user: Actor = Depends(actor),
        dag: str | None = None,
        limit: Annotated[int, Query(gt=0, le=500)] = 20,
    ) -> list[dict[str, Any]]:
        return cp.list_runs(user, dag, limit)

    @app.get("/v1/runs/{run_id}")
    def show_run(run_id: UUID, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.show_run(user, run_id)

    @app.get("/v1/datasets")
    def list_datasets(user: Actor = Depends(actor)) -> list[dict[str, Any]]:
        return cp.list_datasets(user)

    @app.get("/v1/datasets/{name}")
    def show_dataset(name: str, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.show_dataset(user, name)

    @app.post("/v1/datasets/{name}/read-roles")
    def dataset_roles(name: str, body: RolesBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        return {"read_roles": cp.set_read_roles(user, name, body.add, body.remove)}

    @app.post("/v1/query", response_model=None)
    def run_query(body: QueryBody, user: Actor = Depends(actor)) -> Any:
        sql, params = body.statement()
        qs = services.query
        if body.export:
            return qs.export(user, sql, params, body.format if body.format != "json" else "parquet")
        result = qs.query(
            user, sql, params, max_rows=body.max_rows, timeout_seconds=body.timeout_seconds
        )
        if body.format == "json":  # already JSON-safe: skip FastAPI's per-value encoder
            return JSONResponse(result.as_json())
        return Response(
            formats.encode(result.table, body.format),
            media_type=formats.MEDIA_TYPES[body.format],
            headers={"X-Trace-Pinned": json.dumps(result.plan.versions)},
        )

    @app.get("/v1/queries")
    def saved_queries(user: Actor = Depends(actor)) -> list[dict[str, Any]]:
        out = []
        for name in saved.names():
            q = saved.load(name)
            out.append({"name": q.name, "description": q.description, "params": q.defaults})
        return out

    @app.put("/v1/secrets/{name}", status_code=204)
    def put_secret(name: str, body: SecretBody, user: Actor = Depends(actor)) -> None:
        cp.set_secret(user, name, body.value.get_secret_value(), body.use_roles)

    @app.get("/v1/secrets")
    def list_secrets(user: Actor = Depends(actor)) -> list[dict[str, Any]]:
        """Names, owners, use_roles, update times: never values."""
        return cp.list_secrets(user)

    return app


class DeployBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    yaml: str = Field(max_length=1024 * 1024)
    source: str | None = None


class TriggerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: dict[str, Any] = Field(default_factory=dict)


class RolesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    add: list[str] = Field(default_factory=list)
    remove: list[str] = Field(default_factory=list)


class QueryBody(BaseModel):
    """Exactly one of `sql` or `saved` (a saved query's name, with `params`)."""

    model_config = ConfigDict(extra="forbid")
    sql: str | None = Field(default=None, max_length=100_000)
    saved: str | None = None
    params: dict[str, str | int] = Field(default_factory=dict)
    format: Literal["json", "csv", "parquet"] = "json"
    export: bool = False
    max_rows: int | None = Field(default=None, gt=0)
    timeout_seconds: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_statement(self) -> QueryBody:
        if (self.sql is None) == (self.saved is None):
            raise ValueError("give exactly one of sql or saved")
        return self

    def statement(self) -> tuple[str, dict[str, Any]]:
        if self.saved is not None:
            q = saved.load(self.saved)
            return q.sql, q.params(self.params)
        assert self.sql is not None
        return self.sql, dict(self.params)


class SecretBody(BaseModel):
    """`use_roles` replaces the secret's use_roles; omitted, they are kept (none when new)."""

    model_config = ConfigDict(extra="forbid")
    value: SecretStr
    use_roles: list[str] | None = None
