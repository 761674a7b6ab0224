"""`/v1/names`: who may publish which dataset names (grants by name or prefix, admins only),
and an admin taking a published name back (registry/names.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from trace_platform.api.auth import ActorDependency
from trace_platform.api.bodies import NameGrantBody
from trace_platform.api.routes import trace_router
from trace_platform.identity import Actor
from trace_platform.services import Services


def router(services: Services, actor: ActorDependency) -> APIRouter:
    cp = services.control
    r = trace_router()

    @r.get("/v1/names")
    def list_names(user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.list_names(user)

    @r.post("/v1/names/grants")
    def grant_name(body: NameGrantBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.grant_name(user, body.pattern, user=body.user, role=body.role)

    @r.post("/v1/names/revoke")
    def revoke_name(body: NameGrantBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.revoke_name(user, body.pattern, user=body.user, role=body.role)

    @r.post("/v1/names/{name}/reclaim")
    def reclaim_name(name: str, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.reclaim_name(user, name)

    return r
