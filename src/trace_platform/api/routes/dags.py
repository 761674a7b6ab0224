"""`/v1/dags` and `/v1/hooks`: DAGs deployed, listed, shown, and fired by hand or by a named
webhook (the same durable intent + outbox path as cron)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header

from trace_platform.api.auth import ActorDependency
from trace_platform.api.bodies import BackfillBody, DeployBody, RollbackBody, TriggerBody
from trace_platform.api.routes import trace_router
from trace_platform.control.changes import plan_json
from trace_platform.control.service import ControlPlane
from trace_platform.identity import Actor
from trace_platform.services import Services


def router(services: Services, actor: ActorDependency) -> APIRouter:
    cp = services.control
    r = trace_router()

    @r.post("/v1/dags", status_code=201)
    def deploy_dag(
        body: DeployBody,
        user: Actor = Depends(actor),
        dry_run: bool = False,
        manual_cutover: bool = False,
    ) -> dict[str, Any]:
        """Deploy; with `dry_run` nothing changes and the answer is the diff (changed jobs,
        whether each alters its data, the rebuilt subgraph and the history it replays)."""
        res = cp.deploy(
            user,
            body.yaml,
            body.source or "<request>",
            dry_run=dry_run,
            manual_cutover=manual_cutover,
        )
        return {**plan_json(res), "dry_run": dry_run}

    @r.get("/v1/dags")
    def list_dags(user: Actor = Depends(actor)) -> list[dict[str, Any]]:
        return cp.list_dags(user)

    @r.get("/v1/dags/{name}")
    def show_dag(
        name: str, user: Actor = Depends(actor), version: int | None = None
    ) -> dict[str, Any]:
        return cp.show_dag(user, name, version)

    @r.get("/v1/dags/{name}/status")
    def dag_status(name: str, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.changes.status(user, name)

    @r.post("/v1/dags/{name}/cutover")
    def dag_cutover(name: str, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.changes.cutover(user, name)

    @r.post("/v1/dags/{name}/rollback")
    def dag_rollback(
        name: str, user: Actor = Depends(actor), body: RollbackBody | None = None
    ) -> dict[str, Any]:
        return cp.changes.rollback(user, name, body.to if body else None)

    @r.post("/v1/dags/{name}/backfill")
    def dag_backfill(name: str, body: BackfillBody, user: Actor = Depends(actor)) -> dict[str, Any]:
        """Replay chosen input scopes for chosen jobs (and so their downstream) as one run;
        `dry_run`: only the plan."""
        return cp.changes.backfill(
            user,
            name,
            jobs=body.jobs,
            from_block=body.from_block,
            to_block=body.to_block,
            scopes=body.scopes,
            dry_run=body.dry_run,
        )

    @r.post("/v1/dags/{name}/pause")
    def dag_pause(name: str, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.changes.set_paused(user, name, True)

    @r.post("/v1/dags/{name}/resume")
    def dag_resume(name: str, user: Actor = Depends(actor)) -> dict[str, Any]:
        return cp.changes.set_paused(user, name, False)

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

    _webhook(r, cp, actor)
    return r


def hooks_router(services: Services, actor: ActorDependency) -> APIRouter:
    """The named webhook's route alone: what the API Gateway entry serves (aws/apigateway.py)."""
    r = trace_router()
    _webhook(r, services.control, actor)
    return r


def _webhook(r: APIRouter, cp: ControlPlane, actor: ActorDependency) -> None:
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
