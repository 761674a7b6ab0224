"""`/v1/tasks`: single tasks, created, listed, shown and canceled as a user."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Query

from trace_platform.api.auth import ActorDependency
from trace_platform.api.routes import trace_router
from trace_platform.contract import TaskRef, TaskSpec
from trace_platform.dispatcher.models import CancelResponse, TaskView
from trace_platform.identity import Actor
from trace_platform.services import Services


def router(services: Services, actor: ActorDependency) -> APIRouter:
    cp = services.control
    r = trace_router()

    @r.post("/v1/tasks", status_code=201)
    def create_task(body: TaskSpec, user: Actor = Depends(actor)) -> TaskRef:
        return cp.create_task(user, body)

    @r.get("/v1/tasks")
    def list_tasks(
        user: Actor = Depends(actor), limit: Annotated[int, Query(gt=0, le=1000)] = 50
    ) -> list[dict[str, Any]]:
        return cp.list_tasks(user, limit)

    @r.get("/v1/tasks/{task_id}")
    def get_task(task_id: UUID, user: Actor = Depends(actor)) -> TaskView:
        return cp.get_task(user, task_id)

    @r.post("/v1/tasks/{task_id}/cancel")
    def cancel_task(task_id: UUID, user: Actor = Depends(actor)) -> CancelResponse:
        return cp.cancel_task(user, task_id)

    return r
