"""`/internal/*`: the worker wrapper's side of the Dispatcher (claim, fetch, secrets,
heartbeat, events, completion). Every route needs the platform's internal token, checked
for all of `/internal/*` before a body is read (`api/gateway.py` InternalToken)."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Header, Query

from trace_platform.api.routes import trace_router
from trace_platform.contract import (
    Claim,
    ClaimRequest,
    CompleteBody,
    CompleteRequest,
    CompleteResponse,
    EventsBody,
    EventsRequest,
    EventsResponse,
    HeartbeatBody,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRef,
    TaskPayload,
)
from trace_platform.services import Services


def lease_ref(
    task_id: UUID,
    attempt: Annotated[int, Query(gt=0)],
    x_lease_token: Annotated[UUID, Header()],
) -> LeaseRef:
    """Every fenced call's lease reference, the one way it travels (see `LeaseRef`)."""
    return LeaseRef(task_id=task_id, attempt=attempt, lease_token=x_lease_token)


Lease = Annotated[LeaseRef, Depends(lease_ref)]


def router(services: Services) -> APIRouter:
    d = services.dispatcher
    r = trace_router()

    @r.post("/internal/claim")
    def claim(body: ClaimRequest) -> Claim:
        return d.claim(body, payload=True)  # the task-fetch payload rides along

    @r.get("/internal/task-fetch")
    def task_fetch(ref: Lease) -> TaskPayload:
        return d.fetch(ref)

    @r.get("/internal/task-secrets")
    def task_secrets(ref: Lease) -> dict[str, str]:
        return d.secrets(ref)

    @r.post("/internal/heartbeat")
    def heartbeat(ref: Lease, body: HeartbeatBody) -> HeartbeatResponse:
        return d.heartbeat(HeartbeatRequest(**dict(ref), **dict(body)))

    @r.post("/internal/events")
    def events(ref: Lease, body: EventsBody) -> EventsResponse:
        return d.events(EventsRequest(**dict(ref), **dict(body)))

    @r.post("/internal/task-complete")
    def task_complete(ref: Lease, body: CompleteBody) -> CompleteResponse:
        return d.complete(CompleteRequest(**dict(ref), **dict(body)))

    return r
