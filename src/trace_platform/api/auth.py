"""Who is calling. Every `/v1/*` call acts as a user, named by an API key (or Lite's admin when
auth is permissive and no key is given). `/internal/*` is the worker wrapper, proven by the
platform's internal token before its body is read (`api/gateway.py` InternalToken)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Header

from trace_platform.errors import Unauthorized
from trace_platform.identity import Actor, keyless_admin
from trace_platform.services import Services

ActorDependency = Callable[..., Actor]


def actor_dependency(services: Services) -> ActorDependency:
    """A dependency answering the Actor a call acts as (401 when there is none)."""

    def actor(authorization: Annotated[str | None, Header()] = None) -> Actor:
        key = authorization.removeprefix("Bearer ").strip() if authorization else None
        found = services.authenticate(key)  # cached in an API (identity/actors.py)
        if found is not None:
            return found
        if key is None and services.settings.auth == "permissive":
            with services.pool.connection() as conn:
                admin = keyless_admin(conn)
            if admin is None:
                raise Unauthorized(
                    "the Lite admin was removed, so a call without a key acts as nobody: "
                    "give an API key (Authorization: Bearer <key>)"
                )
            return admin
        raise Unauthorized(
            "an API key is required (Authorization: Bearer <key>)"
            if key is None
            else "unknown or revoked API key, or an expired one"
        )

    return actor
