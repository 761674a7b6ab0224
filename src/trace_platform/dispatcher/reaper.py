"""The reaper loop and partition upkeep: both safe to run in every Dispatcher process."""

from __future__ import annotations

import logging
import threading
import time

from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.fleet import WorkerRegistry

log = logging.getLogger(__name__)
_PARTITIONS_EVERY = 6 * 3600.0


def ensure_partitions(dispatcher: Dispatcher) -> int:
    return dispatcher.store.ensure_partitions()


def run_reaper(dispatcher: Dispatcher, stop: threading.Event, interval: float = 1.0) -> None:
    """Each tick: workers silent too long declared dead and their attempts ended (the
    registry's), then lapsed leases and deadlines (the lifecycle's), then stranded wake-ups."""
    last_partitions = 0.0
    registry = WorkerRegistry.of(dispatcher)
    # Since when this reaper has watched without a gap: a worker is declared dead, or a lapsed
    # lease ended, only for a silence seen here, not for one while this process (or the
    # database) was away and no beat could land (an API back from a restart, or a database
    # back from an outage longer than a lease, would otherwise end the whole fleet's work).
    # Deadlines are ended at once: no beat moves them.
    watching: float | None = None
    last_tick = time.monotonic()
    lease = dispatcher.settings.lease_seconds
    while not stop.is_set():
        seen = False
        if time.monotonic() - last_tick > max(lease, 2 * interval):  # this process stalled
            watching = None
        try:
            if time.monotonic() - last_partitions > _PARTITIONS_EVERY:
                ensure_partitions(dispatcher)
                if registry is not None:
                    registry.prune()
                last_partitions = time.monotonic()
            watching = time.monotonic() if watching is None else watching
            watched = time.monotonic() - watching
            if registry is not None:
                registry.reap_dead(watched)
            while dispatcher.reap(leases=watched >= lease) > 0:
                pass
            seen = True
            dispatcher.rewake(dispatcher.settings.rewake_after_seconds)
        except Exception as e:  # keep reaping after any transient failure
            log.warning("reaper: %s", e)
        if not seen:  # the database was not reached: the watch starts again
            watching = None
        last_tick = time.monotonic()
        stop.wait(interval)
