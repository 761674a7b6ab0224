"""Routing: which destinations an alert goes to, its deterministic idempotency key per
(alert, destination), and `max_delivery_age` gating (an alert older than that is recorded as a
suppressed delivery, never sent)."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trace_platform.alerts.datasets import SEVERITIES
from trace_platform.dag.schema import NAME_RE

Severity = Literal["info", "warning", "critical"]


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    destination: str = Field(pattern=NAME_RE, description="a destination of the org, by name")
    rules: list[str] | None = Field(
        default=None, max_length=64, description="only these rules' alerts (default: all)"
    )
    min_severity: Severity = Field(default="info", description="only alerts at least this severe")
    dags: list[str] | None = Field(
        default=None, max_length=64, description="only alerts of these DAG ids (default: all)"
    )

    def takes(self, alert: dict[str, Any]) -> bool:
        if self.rules is not None and alert["rule"] not in self.rules:
            return False
        if self.dags is not None and str(alert["dag_id"]) not in self.dags:
            return False
        rank = SEVERITIES.index(alert["severity"]) if alert["severity"] in SEVERITIES else -1
        return rank >= SEVERITIES.index(self.min_severity)


def idempotency_key(org_id: Any, alert: dict[str, Any], destination: str) -> str:
    """The same alert to the same destination: always this key (whichever job routed it,
    however often). A Standard Webhooks `webhook-id`."""
    parts = (org_id, alert["dag_id"], alert["job"], alert["rule"], alert["dedupe_key"])
    text = "\x1f".join(str(p) for p in (*parts, destination))
    return "alert_" + hashlib.sha256(text.encode()).hexdigest()[:40]


def deliveries(
    org_id: Any,
    alerts: list[dict[str, Any]],
    routes: list[Route],
    *,
    now: datetime,
    max_delivery_age: float,
) -> list[dict[str, Any]]:
    """One alert_deliveries row per (alert, destination) the routes take it to: `pending`,
    or `suppressed` when the alert is older than `max_delivery_age` seconds."""
    out: dict[str, dict[str, Any]] = {}
    for a in alerts:
        when: datetime = a["event_time"]
        age = (now - when).total_seconds()
        for r in routes:
            if not r.takes(a):
                continue
            key = idempotency_key(org_id, a, r.destination)
            late = age > max_delivery_age
            out.setdefault(
                key,
                {
                    "idempotency_key": key,
                    "destination": r.destination,
                    "status": "suppressed" if late else "pending",
                    "alert_dag_id": str(a["dag_id"]),
                    "alert_job": a["job"],
                    "rule": a["rule"],
                    "dedupe_key": a["dedupe_key"],
                    "severity": a["severity"],
                    "event_time": when.isoformat(),
                    "payload": a["payload"],
                    "reason": (
                        f"event {int(age)} s old at routing; max_delivery_age is "
                        f"{int(max_delivery_age)} s"
                        if late
                        else None
                    ),
                },
            )
    return list(out.values())
