"""`/internal/*`: the worker wrapper's side of the Dispatcher (claim, fetch, secrets,
heartbeat, events, completion). Every route needs the platform's internal token, checked
for all of `/internal/*` before a body is read (`api/gateway.py` InternalToken)."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Header, Query

from trace_platform.api.routes import trace_router
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
)
from trace_platform.services import Services


def router(services: Services) -> APIRouter:
    d = services.dispatcher
    r = trace_router()

    @r.post("/internal/claim")
    def claim(body: ClaimRequest) -> Claim:
        return d.claim(body)

    @r.get("/internal/task-fetch")
    def task_fetch(
        task_id: UUID,
        attempt: Annotated[int, Query(gt=0)],
        x_lease_token: Annotated[UUID, Header()],
    ) -> TaskPayload:
        return d.fetch(LeaseRef(task_id=task_id, attempt=attempt, lease_token=x_lease_token))

    @r.get("/internal/task-secrets")
    def task_secrets(
        task_id: UUID,
        attempt: Annotated[int, Query(gt=0)],
        x_lease_token: Annotated[UUID, Header()],
    ) -> dict[str, str]:
        return d.secrets(LeaseRef(task_id=task_id, attempt=attempt, lease_token=x_lease_token))

    @r.post("/internal/heartbeat")
    def heartbeat(body: HeartbeatRequest) -> HeartbeatResponse:
        return d.heartbeat(body)

    @r.post("/internal/events")
    def events(body: EventsRequest) -> EventsResponse:
        return d.events(body)

    @r.post("/internal/task-complete")
    def task_complete(body: CompleteRequest) -> CompleteResponse:
        return d.complete(body)

    return r
