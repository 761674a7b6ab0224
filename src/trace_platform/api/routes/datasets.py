"""`/v1/datasets`: datasets listed and shown, who may read them, their versions and purges;
`/v1/buffers`: the batches published to the buffered datasets the user may read."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query

from trace_platform.api.auth import ActorDependency
from trace_platform.api.bodies import PurgeBody, RolesBody
from trace_platform.api.routes import trace_router
from trace_platform.identity import Actor
from trace_platform.services import Services


def router(services: Services, actor: ActorDependency) -> APIRouter:
    cp = services.control
    r = trace_router()

    @r.get("/v1/datasets")
    def list_datasets(user: Actor = Depends(actor)) -> list[dict[str, Any]]:
        return cp.list_datasets(user)

    @r.get("/v1/datasets/{name}")
    def show_dataset(name: str, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.show_dataset(user, name)

    @r.post("/v1/datasets/{name}/read-roles")
    def dataset_roles(name: str, body: RolesBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        return {"read_roles": cp.set_read_roles(user, name, body.add, body.remove)}

    @r.get("/v1/datasets/{name}/versions")
    def dataset_versions(name: str, user: Actor = Depends(actor)) -> list[dict[str, Any]]:
        return cp.dataset_versions(user, name)

    @r.post("/v1/datasets/{name}/purge")
    def purge_versions(name: str, body: PurgeBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.purge_versions(user, name, body.keep, dry_run=body.dry_run)

    @r.get("/v1/buffers")
    def list_buffers(
        user: Actor = Depends(actor),
        dataset: str | None = None,
        status: Literal["pending", "loaded", "dead"] | None = None,
        limit: Annotated[int, Query(gt=0, le=1000)] = 50,
    ) -> list[dict[str, Any]]:
        """Batches published to buffered datasets the user may read, newest first; a dead one
        says why the sink refused it."""
        return cp.list_buffers(user, dataset=dataset, status=status, limit=limit)

    return r
