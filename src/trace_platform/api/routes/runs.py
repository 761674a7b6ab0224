"""`/v1/runs`: DAG runs, listed (optionally for one DAG) and shown with their tasks."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Query

from trace_platform.api.auth import ActorDependency
from trace_platform.api.routes import trace_router
from trace_platform.identity import Actor
from trace_platform.services import Services


def router(services: Services, actor: ActorDependency) -> APIRouter:
    cp = services.control
    r = trace_router()

    @r.get("/v1/runs")
    def list_runs(
        user: Actor = Depends(actor),
        dag: str | None = None,
        limit: Annotated[int, Query(gt=0, le=500)] = 20,
    ) -> list[dict[str, Any]]:
        return cp.list_runs(user, dag, limit)

    @r.get("/v1/runs/{run_id}")
    def show_run(run_id: UUID, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.show_run(user, run_id)

    @r.post("/v1/runs/{run_id}/cancel")
    def cancel_run(run_id: UUID, user: Actor = Depends(actor)) -> dict[str, Any]:
        """Cancels every unfinished task of the run (running ones cooperatively)."""
        return cp.cancel_run(user, run_id)

    @r.post("/v1/runs/{run_id}/retry")
    def retry_run(run_id: UUID, user: Actor = Depends(actor)) -> dict[str, Any]:
        """Queues again every task of the run that ended failed, each with a fresh budget of
        tries (its next attempt numbered on from the last); `retried`: 0 when none had."""
        return cp.retry_run(user, run_id)

    return r
