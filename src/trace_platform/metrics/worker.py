"""A worker's metrics (`trace worker`, served on TRACE_WORKER_METRICS_PORT): its claims and
how long they took, the attempts it ran to their end by outcome, its heartbeats, and its
operator hosts' starts. Counted where the worker talks to the API (worker/client.py: every
answer it gets) and where it starts a host (worker/operator_host.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector

from trace_platform.config import Settings
from trace_platform.contract import Claim, ClaimRequest, CompleteResponse
from trace_platform.metrics.server import MetricsServer

log = logging.getLogger(__name__)

CLAIM_RESULTS = ("claimed", "refused", "error")
OUTCOMES = ("succeeded", "failed", "canceled", "released")
HEARTBEAT_RESULTS = ("accepted", "refused", "error")
HOST_STARTS = ("first", "tenant", "restart")
# Seconds: a claim through the exchange listener takes about a millisecond.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class WorkerMetrics:
    """One worker process's registry (its own, not the library's global one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.claims = Counter(
            "trace_worker_claims",
            "Claims of wake-ups by answer: claimed (an attempt leased: a task run), refused "
            "(not claimable), error (the API unreachable or failing)",
            ["result"],
            registry=self.registry,
        )
        self.claim_seconds = Histogram(
            "trace_worker_claim_seconds",
            "From a claim's request to its answer (one exchange carries a batch of them)",
            buckets=CLAIM_BUCKETS,
            registry=self.registry,
        )
        self.tasks = Counter(
            "trace_worker_tasks",
            "Attempts this worker ran to their end, by the outcome the Dispatcher accepted",
            ["outcome"],
            registry=self.registry,
        )
        self.reports_lost = Counter(
            "trace_worker_reports_unaccepted",
            "Attempt reports the Dispatcher refused or never answered",
            registry=self.registry,
        )
        self.heartbeats = Counter(
            "trace_worker_heartbeats",
            "Attempt heartbeats sent, by answer: accepted, refused (the lease was lost), error",
            ["result"],
            registry=self.registry,
        )
        self.host_starts = Counter(
            "trace_worker_operator_host_starts",
            "Operator host processes started: first (a wrapper's first), tenant (the next task "
            "was another tenant's), restart (the last one died or was killed)",
            ["reason"],
            registry=self.registry,
        )
        ProcessCollector(namespace="trace_worker", registry=self.registry)
        for labels, counter in (
            (CLAIM_RESULTS, self.claims),
            (OUTCOMES, self.tasks),
            (HEARTBEAT_RESULTS, self.heartbeats),
            (HOST_STARTS, self.host_starts),
        ):
            for label in labels:
                counter.labels(label)

    def answered(self, asks: Sequence[object], answers: Sequence[object], seconds: float) -> None:
        """One exchange's asks (ClaimRequest, or (Claim, CompleteItem)) and their answers."""
        for ask, answer in zip(asks, answers, strict=True):
            if isinstance(ask, ClaimRequest):
                self.claim_seconds.observe(seconds)
                self.claims.labels(_result(answer, Claim, "claimed")).inc()
            elif isinstance(answer, CompleteResponse):
                self.tasks.labels(ask[1].outcome).inc()  # type: ignore[index]
            else:
                self.reports_lost.inc()

    def heartbeat(self, answer: object) -> None:
        self.heartbeats.labels(_result(answer, object, "accepted")).inc()


def _result(answer: object, ok: type, name: str) -> str:
    """`name` for an answer of type `ok`; a refusal (an API error below 500) or an error."""
    if isinstance(answer, BaseException):
        status = getattr(answer, "status", None)
        return "refused" if isinstance(status, int) and status < 500 else "error"
    return name if isinstance(answer, ok) else "error"


def serve_worker_metrics(settings: Settings) -> tuple[WorkerMetrics, MetricsServer | None]:
    """The worker's metrics, and their listener when TRACE_WORKER_METRICS_PORT is set. A port
    that cannot be bound (another worker of the host has it) is logged and the worker runs on
    without one: metrics never stop the work."""
    metrics = WorkerMetrics()
    port = settings.worker_metrics_port
    if port is None:
        return metrics, None
    host = settings.worker_metrics_host
    try:
        server = MetricsServer(metrics.registry, host, port)
    except OSError as e:
        log.error(
            "the worker's metrics cannot listen on %s:%d (TRACE_WORKER_METRICS_PORT): %s",
            host,
            port,
            e,
        )
        return metrics, None
    return metrics, server.start()
