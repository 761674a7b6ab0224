"""`/v1/audit`: the org's audit log for its admins (trace_platform/audit.py), as `trace audit
list` shows it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from trace_platform.api.auth import ActorDependency
from trace_platform.api.routes import trace_router
from trace_platform.audit import MAX_LIMIT
from trace_platform.identity import Actor
from trace_platform.services import Services


def router(services: Services, actor: ActorDependency) -> APIRouter:
    r = trace_router()

    @r.get("/v1/audit")
    def audit_log(
        user: Actor = Depends(actor),
        actor_name: Annotated[str | None, Query(alias="actor", max_length=200)] = None,
        since: Annotated[str | None, Query(max_length=64)] = None,
        action: Annotated[str | None, Query(max_length=64)] = None,
        dag: Annotated[str | None, Query(max_length=128)] = None,
        limit: Annotated[int, Query(gt=0, le=MAX_LIMIT)] = 50,
        before: Annotated[str | None, Query(max_length=64)] = None,
    ) -> dict[str, Any]:
        """Who did what, newest first (org admins only, their org's rows only): `entries`, and
        `next`, the `before` of the following page (null on the last). `actor` is a user's
        name (or system, scheduler, eventbridge); `since` a span back from now (30m, 24h, 7d)
        or an ISO date or time."""
        return services.control.audit_log(
            user,
            who=actor_name,
            since=since,
            action=action,
            dag=dag,
            limit=limit,
            before=before,
        )

    return r
