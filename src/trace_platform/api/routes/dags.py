"""`/v1/dags` and `/v1/hooks`: DAGs deployed, listed, shown, and fired by hand or by a named
webhook (the same durable intent + outbox path as cron)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header

from trace_platform.api.auth import ActorDependency
from trace_platform.api.bodies import DeployBody, TriggerBody
from trace_platform.api.routes import trace_router
from trace_platform.identity import Actor
from trace_platform.services import Services


def router(services: Services, actor: ActorDependency) -> APIRouter:
    cp = services.control
    r = trace_router()

    @r.post("/v1/dags", status_code=201)
    def deploy_dag(body: DeployBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        res = cp.deploy(user, body.yaml, body.source or "<request>")
        return {
            "dag_id": res.dag_id,
            "name": res.name,
            "version": res.version,
            "created": res.created,
            "rebuilt_jobs": res.rebuilt_jobs,
            "datasets": res.datasets,
        }

    @r.get("/v1/dags")
    def list_dags(user: Actor = Depends(actor)) -> list[dict[str, Any]]:
        return cp.list_dags(user)

    @r.get("/v1/dags/{name}")
    def show_dag(
        name: str, user: Actor = Depends(actor), version: int | None = None
    ) -> dict[str, Any]:
        return cp.show_dag(user, name, version)

    @r.post("/v1/dags/{name}/trigger", status_code=201)
    def trigger_dag(
        name: str,
        user: Actor = Depends(actor),
        body: TriggerBody | None = None,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> dict[str, Any]:
        return cp.trigger(
            user, name, fire_key=idempotency_key, config=body.config if body else None
        )

    @r.post("/v1/hooks/{dag}/{trigger}", status_code=201)
    def webhook(
        dag: str,
        trigger: str,
        user: Actor = Depends(actor),
        body: dict[str, Any] | None = None,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
    ) -> dict[str, Any]:
        """A named webhook: the same durable intent + outbox path as cron and manual runs."""
        return cp.trigger(
            user, dag, trigger=trigger, kind="webhook", fire_key=idempotency_key, config=body or {}
        )

    return r
