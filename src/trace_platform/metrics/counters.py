"""What a Dispatcher handled, counted in its process: heartbeats, attempts the reaper ended and
workers it declared dead. Rates come from these (a gauge read off the database cannot say how
many heartbeats landed since the last scrape)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Counter
from prometheus_client.metrics_core import Metric

HEARTBEAT_RESULTS = ("accepted", "refused")
REAP_REASONS = ("lease_expired", "timed_out", "worker_dead")


class DispatcherMetrics:
    """A Collector (the API's registry reads it); the counters belong to no registry of their
    own, so each Dispatcher has its own and none clashes with another's."""

    def __init__(self) -> None:
        self.heartbeats = Counter(
            "trace_heartbeats",
            "Attempt heartbeats this process handled: accepted, or refused (the lease was lost)",
            ["result"],
            registry=None,
        )
        self.reaped = Counter(
            "trace_attempts_reaped",
            "Running attempts the reaper ended: lease_expired (missed heartbeats), timed_out "
            "(past timeout_seconds), worker_dead (its worker declared dead)",
            ["reason"],
            registry=None,
        )
        self.workers_dead = Counter(
            "trace_workers_declared_dead",
            "Workers the reaper declared dead (silent for three of their beats)",
            registry=None,
        )
        # Every series from the start, at 0: a rate over a series that appears only at its
        # first event misses that event.
        for result in HEARTBEAT_RESULTS:
            self.heartbeats.labels(result)
        for reason in REAP_REASONS:
            self.reaped.labels(reason)

    def heartbeat(self, accepted: bool) -> None:
        self.heartbeats.labels("accepted" if accepted else "refused").inc()

    def collect(self) -> Iterator[Metric]:
        for counter in (self.heartbeats, self.reaped, self.workers_dead):
            yield from counter.collect()
