"""The API's request latencies: a histogram labelled by route template, method and status.

The route is the template the router matched (`/v1/dags/{name}`), never the raw path, so the
series are bounded by the API's routes whatever callers send; a request no route matched (a
404 off every route, or one refused before routing) is `unmatched`. Methods outside the
standard set are `other`."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED = "unmatched"
# Seconds: the internal calls take about a millisecond, a query up to its time limit.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def request_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "trace_http_request_duration_seconds",
        "API requests by route template, method and status, from the first byte in to the "
        "last byte of the answer",
        ["route", "method", "status"],
        buckets=BUCKETS,
        registry=registry,
    )


def route_label(scope: Scope) -> str:
    """The template of the route that served `scope` (the router sets it on the scope)."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


class RequestTimer:
    """A pure ASGI middleware (the outermost: it times what every other one does too)."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500  # an app that raises before answering is answered 500 by the server

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.histogram.labels(route_label(scope), method, str(status)).observe(
                time.perf_counter() - began
            )
