"""`/v1/secrets`: secrets set (value and use_roles) and listed, never read back."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from trace_platform.api.auth import ActorDependency
from trace_platform.api.bodies import SecretBody
from trace_platform.api.routes import trace_router
from trace_platform.identity import Actor
from trace_platform.services import Services


def router(services: Services, actor: ActorDependency) -> APIRouter:
    cp = services.control
    r = trace_router()

    @r.put("/v1/secrets/{name}", status_code=204)
    def put_secret(name: str, body: SecretBody, user: Actor = Depends(actor)) -> None:
        cp.set_secret(user, name, body.value.get_secret_value(), body.use_roles)

    @r.get("/v1/secrets")
    def list_secrets(user: Actor = Depends(actor)) -> list[dict[str, Any]]:
        """Names, owners, use_roles, update times: never values."""
        return cp.list_secrets(user)

    return r
