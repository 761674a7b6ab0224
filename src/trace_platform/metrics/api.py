"""The API process's registry: its request latencies, what its Dispatcher handled, the
platform's state read from Postgres at each scrape, its caches and the process itself.

Served on TRACE_METRICS_PORT (bound to TRACE_METRICS_HOST, default the API's host), a listener
of its own, not a route of the API: Prometheus scrapes it over the operators' network without
an API key, and no API key of any org, an admin's included, reaches it through the API (the
figures are platform-wide: every org's tasks together)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.metrics_core import Metric

from trace_platform.config import QueueBackend
from trace_platform.metrics.http import request_histogram
from trace_platform.metrics.server import MetricsServer
from trace_platform.metrics.state import StateCollector, cache_families
from trace_platform.services import Services
from trace_platform.tls import server_context

log = logging.getLogger(__name__)


class CacheCollector:
    """This process's in-process caches (`trace_platform.cache`), counted by name."""

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            from trace_platform.cache import stats
        except ImportError:  # a build without the caches (issue 42 adds them): none to show
            return
        yield from cache_families(stats())


class _DispatcherCounters:
    """The process's Dispatcher's counters (`counters.py`), looked up at each scrape."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.services.dispatcher.metrics.collect()


class _Reads:
    """Where the read-only paths read (db/replica.py): reads by server, fallbacks to the
    primary and the replica's lag, looked up at each scrape."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        if self.services.reads is not None:
            yield from self.services.reads.collect()


class ApiMetrics:
    def __init__(self, services: Services) -> None:
        s = services.settings
        self.registry = CollectorRegistry()
        self.requests: Histogram = request_histogram(self.registry)
        self.registry.register(_DispatcherCounters(services))
        sqs = s.queue_driver is QueueBackend.sqs
        depths = getattr(services.driver, "approximate_depths", None) if sqs else None
        self.registry.register(
            StateCollector(
                services.pool,
                queues=(s.task_queue, s.lambda_queue),
                pgqueue=not sqs,
                depths=depths,
            )
        )
        self.registry.register(CacheCollector())
        self.registry.register(_Reads(services))
        ProcessCollector(namespace="trace_api", registry=self.registry)


def serve_metrics(services: Services, metrics: ApiMetrics) -> MetricsServer | None:
    """The API's /metrics listener, serving, when the settings give it a port. A port that
    cannot be bound is logged and the API serves on without it (metrics are never what the
    platform's work waits on)."""
    s = services.settings
    if s.metrics_port is None:
        return None
    host = s.metrics_host or s.api_host
    try:
        server = MetricsServer(metrics.registry, host, s.metrics_port, server_context(s))
    except OSError as e:
        log.error("the metrics listener cannot listen on %s:%d (%s)", host, s.metrics_port, e)
        return None
    log.info("metrics on %s:%d%s", host, server.port, "/metrics")
    return server.start()
