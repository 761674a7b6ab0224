"""`/healthz`: the state store answers, and how many outbox rows wait to be published."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from trace_platform.api.routes import trace_router
from trace_platform.services import Services


def router(services: Services) -> APIRouter:
    r = trace_router()

    @r.get("/healthz")
    def healthz() -> dict[str, Any]:
        # Counting the outbox backlog is a round trip to the state store: it answers, or 500.
        return {"ok": True, "outbox_pending": services.publisher.pending()}

    return r
