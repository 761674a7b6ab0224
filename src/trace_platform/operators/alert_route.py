"""alert_route: routes the org's alerts to destinations. Its input is the org's
`alert_events` (`inputs: [{from: {dataset: alert_events}}]`): each batch the sink lands there
starts it, and it routes the alerts that batch added (a manual run routes every alert again,
harmlessly: the keys are deterministic). Each (alert, destination) a route takes becomes one
row of the org's shared `alert_deliveries` with a deterministic idempotency key — `pending`,
or `suppressed` when the alert's `event_time` is older than `max_delivery_age` (recorded, never
sent). The Delivery Service sends the pending ones.

A trusted platform operator: it reads `alert_events` on the platform's data login, so it runs
only as runtime ecs_platform. It talks to no destination itself."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

import psycopg
from pydantic import Field

from trace_platform.alerts.datasets import ALERT_DELIVERIES, ALERT_EVENTS
from trace_platform.alerts.routing import Route, deliveries
from trace_platform.operators.config import OperatorConfig
from trace_platform.operators.context import OperatorContext, OperatorResult, PermanentError
from trace_platform.store.alert_rows import alert_events


class AlertRouteConfig(OperatorConfig):
    routes: list[Route] = Field(min_length=1, max_length=32, description="where alerts go")
    max_delivery_age: float = Field(
        default=3600,
        gt=0,
        le=10 * 365 * 86400,
        description="seconds: an alert whose event_time is older is recorded, not sent",
    )

    def job_problems(self, inputs: int, outputs: int) -> list[tuple[str, str]]:
        if outputs:
            return [("outputs", "alert_route writes the org's alert_deliveries only")]
        return []


def alert_route(ctx: OperatorContext) -> OperatorResult:
    cfg = AlertRouteConfig.from_ctx(ctx)
    dsn = ctx.env.get("TRACE_SINK_DSN")
    if not dsn:
        raise PermanentError(
            "alert_route is a trusted platform operator: it runs only as runtime ecs_platform "
            "on a platform worker"
        )
    ref = next((r for r in ctx.task.inputs if r.dataset_name == ALERT_EVENTS.name), None)
    if ref is None or ref.location is None:
        raise PermanentError(
            "alert_route reads the org's alert_events: inputs: [{from: {dataset: alert_events}}]"
        )
    event = ctx.task.input_event or {}
    payload = event.get("payload") or {}
    record = payload.get("record_id") if isinstance(payload, dict) else None
    with psycopg.connect(dsn, autocommit=True) as conn:
        alerts = alert_events(
            conn, ref.location, ctx.task.org_id, UUID(str(record)) if record else None
        )
    rows = deliveries(
        ctx.task.org_id,
        alerts,
        list(cfg.routes),
        now=datetime.now(UTC),
        max_delivery_age=cfg.max_delivery_age,
    )
    if rows:
        pd = ALERT_DELIVERIES
        ctx.publish_rows(pd.name, rows, max_rows=pd.max_rows, max_bytes=pd.max_bytes)
    ctx.progress(alerts=len(alerts), deliveries=len(rows))
    return OperatorResult()
