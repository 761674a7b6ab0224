"""The worker registry over HTTP (dispatcher/fleet.py): a worker's registration, beats and
clean stop on `/internal/workers/*` (the internal token, checked before a body is read, as for
every `/internal/*` route), and the fleet for org admins on `GET /v1/workers`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from trace_platform.api.auth import ActorDependency
from trace_platform.api.routes import trace_router
from trace_platform.contract_fleet import (
    WorkerBeat,
    WorkerRef,
    WorkerRegistration,
    WorkerState,
    WorkerView,
)
from trace_platform.control.workers import list_workers
from trace_platform.dispatcher.fleet import WorkerRegistry
from trace_platform.identity import Actor
from trace_platform.services import Services


def router(services: Services, actor: ActorDependency) -> APIRouter:
    def registry() -> WorkerRegistry:  # per call: the router only closes over `services`
        return WorkerRegistry(services.dispatcher)

    r = trace_router()

    @r.post("/internal/workers/register")
    def register(body: WorkerRegistration) -> WorkerBeat:
        """A worker starting (or registering again after its answer was lost): 409 for an id
        declared dead, stopped, or registered by another host or pid."""
        return registry().register(body)

    @r.post("/internal/workers/beat")
    def beat(body: WorkerRef) -> WorkerBeat:
        """The worker's own heartbeat: 404 if not registered, 409 once declared dead."""
        return registry().beat(body.worker_id)

    @r.post("/internal/workers/stop")
    def stop(body: WorkerRef) -> WorkerBeat:
        """A clean exit: the worker is listed `stopped`."""
        return registry().stop(body.worker_id)

    @r.get("/v1/workers")
    def workers(
        user: Actor = Depends(actor),
        state: WorkerState | None = None,
        limit: Annotated[int, Query(gt=0, le=1000)] = 100,
    ) -> list[WorkerView]:
        """The registered workers (org admins only), each with the caller's org's running
        tasks on it (not another org's)."""
        return list_workers(services.dispatcher, user, state, limit)

    return r
