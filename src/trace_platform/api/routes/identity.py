"""`/v1/users` and `/v1/keys`: an org's users and API keys, for its admins
(control/identity.py). A key is in an answer once, when it is made."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Depends

from trace_platform.api.auth import ActorDependency
from trace_platform.api.bodies import KeyBody, RotateBody, UserBody
from trace_platform.api.routes import trace_router
from trace_platform.identity import Actor
from trace_platform.services import Services


def _seconds(value: float | None) -> timedelta | None:
    return timedelta(seconds=value) if value is not None else None


def router(services: Services, actor: ActorDependency) -> APIRouter:
    cp = services.control
    ids = cp.identity
    r = trace_router()

    @r.get("/v1/users")
    def list_users(user: Actor = Depends(actor), include_removed: bool = False) -> list[Any]:
        """The org's users: roles, admin flag, live keys (org admins)."""
        return ids.list_users(user, include_removed)

    @r.post("/v1/users", status_code=201)
    def add_user(body: UserBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        """Adds a user (or sets an existing or removed one's roles and admin flag) and answers
        a new API key for them, once."""
        return cp.add_user(user, body.name, body.roles, body.is_admin)

    @r.delete("/v1/users/{name}")
    def remove_user(name: str, user: Actor = Depends(actor)) -> dict[str, Any]:
        """Removes the user and revokes their keys at once; 409 for the org's last admin."""
        return ids.remove_user(user, name)

    @r.get("/v1/keys")
    def list_keys(
        user: Actor = Depends(actor), of: str | None = None, include_ended: bool = False
    ) -> list[Any]:
        """The org's keys (`of`: one user's), never the keys or their digests."""
        return ids.list_keys(user, of, include_ended)

    @r.post("/v1/keys", status_code=201)
    def create_key(body: KeyBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        """A new key for a user of the org, answered once."""
        return ids.create_key(
            user, body.user, body.name, body.expires_at, _seconds(body.expires_in_seconds)
        )

    @r.delete("/v1/keys/{key_id}")
    def revoke_key(key_id: UUID, user: Actor = Depends(actor)) -> dict[str, Any]:
        """Revokes the key: refused by every API process within a second. 404 for a key not
        of the org, 409 for one already revoked or the org's last admin key."""
        return ids.revoke_key(user, key_id)

    @r.post("/v1/keys/{key_id}/rotate", status_code=201)
    def rotate_key(key_id: UUID, body: RotateBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        """A new key for the same user and name, answered once; the old one revoked after
        `grace_seconds`."""
        return ids.rotate_key(
            user, key_id, body.grace_seconds, body.expires_at, _seconds(body.expires_in_seconds)
        )

    return r
