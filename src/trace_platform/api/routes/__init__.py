"""The API's routes, one router per responsibility, assembled by `api.app.create_app`.

Every router is made by `trace_router`, so each of its routes is a gateway `TraceRoute`
(names checked, JSON bodies parsed with bounds). Paths are written out in full (no router
prefix): the gateway finds a path parameter's rule by the route's own path."""

from __future__ import annotations

from fastapi import APIRouter

from trace_platform.api.gateway import TraceRoute


def trace_router() -> APIRouter:
    """An APIRouter whose routes are TraceRoutes."""
    return APIRouter(route_class=TraceRoute)
