"""`/v1/destinations` (where alerts are delivered), `/v1/deliveries` (each delivery and its
attempts) and `/v1/alerts` (the org's alert_events): the same control operations as `trace
destinations|deliveries|alerts`. Destinations and deliveries are an org admin's (403 to anyone
else) and org-scoped; alerts are read through the Query Service, so alert_events' read_roles
decide."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from trace_platform.api.auth import ActorDependency
from trace_platform.api.bodies import DestinationBody
from trace_platform.api.routes import trace_router
from trace_platform.delivery.control import DeliveryControl, alerts_sql
from trace_platform.identity import Actor
from trace_platform.identity.vault import vault_for
from trace_platform.services import Services

Status = Literal["suppressed", "pending", "sending", "delivered", "failed"]


def router(services: Services, actor: ActorDependency) -> APIRouter:
    ctl = DeliveryControl(services.pool, vault_for(services.settings))
    r = trace_router()

    # -- destinations -------------------------------------------------------------------------
    @r.post("/v1/destinations", status_code=201)
    def add_destination(body: DestinationBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        """Adds a webhook destination; the answer holds its signing secret, shown this once
        (Standard Webhooks: `whsec_…`)."""
        secret = ctl.add_destination(user, body.name, body.url, allow_private=body.allow_private)
        return {"name": body.name, "secret": secret}

    @r.get("/v1/destinations")
    def list_destinations(user: Actor = Depends(actor)) -> list[dict[str, Any]]:
        """The org's destinations (never their secrets)."""
        return ctl.list_destinations(user)

    @r.post("/v1/destinations/{name}/disable")
    def disable_destination(name: str, user: Actor = Depends(actor)) -> dict[str, Any]:
        """Holds the destination's deliveries: they wait, retried, until it is enabled again
        or they are too old."""
        ctl.set_destination(user, name, enabled=False)
        return {"name": name, "enabled": False}

    @r.post("/v1/destinations/{name}/enable")
    def enable_destination(name: str, user: Actor = Depends(actor)) -> dict[str, Any]:
        """Its held deliveries are sent at their next retry (those not failed meanwhile for
        being too old)."""
        ctl.set_destination(user, name, enabled=True)
        return {"name": name, "enabled": True}

    @r.post("/v1/destinations/{name}/rotate-secret")
    def rotate_destination_secret(name: str, user: Actor = Depends(actor)) -> dict[str, Any]:
        """A new signing secret, shown this once; the old one no longer verifies."""
        return {"name": name, "secret": ctl.set_destination(user, name, rotate_secret=True)}

    # -- deliveries ---------------------------------------------------------------------------
    @r.get("/v1/deliveries")
    def list_deliveries(
        user: Actor = Depends(actor),
        status: Status | None = None,
        destination: str | None = None,
        limit: Annotated[int, Query(gt=0, le=1000)] = 50,
    ) -> list[dict[str, Any]]:
        """The org's deliveries, newest first."""
        return ctl.list_deliveries(user, status=status, destination=destination, limit=limit)

    @r.get("/v1/deliveries/{delivery_id}")
    def show_delivery(delivery_id: UUID, user: Actor = Depends(actor)) -> dict[str, Any]:
        """A delivery: its idempotency key, its body (the exact text every attempt sends) and
        every attempt (`attempt_log`)."""
        return ctl.show(user, delivery_id)

    @r.post("/v1/deliveries/{delivery_id}/retry")
    def retry_delivery(delivery_id: UUID, user: Actor = Depends(actor)) -> dict[str, Any]:
        """A failed delivery sent again: the same idempotency key, the same body (409 if it
        is not failed, 404 if the org has no such delivery)."""
        ctl.retry(user, delivery_id)
        return {"delivery_id": delivery_id, "status": "pending"}

    # -- alerts -------------------------------------------------------------------------------
    @r.get("/v1/alerts", response_model=None)
    def list_alerts(
        user: Actor = Depends(actor),
        rule: str | None = None,
        limit: Annotated[int, Query(gt=0, le=1000)] = 50,
    ) -> JSONResponse:
        """The org's alerts ("would have alerted" included), newest first: alert_events
        through the Query Service, answered as `/v1/query` answers JSON."""
        return JSONResponse(services.query.query(user, alerts_sql(rule, limit)).as_json())

    return r
