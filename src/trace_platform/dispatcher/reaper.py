"""The reaper loop and partition upkeep: both safe to run in every Dispatcher process."""

from __future__ import annotations

import logging
import threading
import time

from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.fleet import WorkerRegistry

log = logging.getLogger(__name__)
_PARTITIONS_EVERY = 6 * 3600.0
_UPKEEP_RETRY = 60.0  # after a failed partition upkeep


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
    # A gap is a time without reaching the database (a stall of this process included) longer
    # than a beat: a failed tick or two within it stopped no beat, and restarting the watch on
    # each let a database failing now and then keep a dead worker's lease for ever.
    # Deadlines are ended at once: no beat moves them.
    watching: float  # set by the first tick (nothing reached yet)
    reached: float | None = None  # when a tick last reached the database
    lease = dispatcher.settings.lease_seconds
    gap = max(dispatcher.settings.heartbeat_seconds, 2 * interval)
    while not stop.is_set():
        try:
            now = time.monotonic()
            if reached is None or now - reached > gap:  # back from a gap: the watch starts
                watching = now
            if now - last_partitions > _PARTITIONS_EVERY:
                # Its own failure stops no reaping: said, and tried again a minute later.
                last_partitions = now - _PARTITIONS_EVERY + _UPKEEP_RETRY
                try:
                    ensure_partitions(dispatcher)
                    if registry is not None:
                        registry.prune()
                    last_partitions = time.monotonic()
                except Exception as e:
                    log.warning("reaper: partition upkeep failed (again in a minute): %s", e)
            watched = time.monotonic() - watching
            if registry is not None:
                registry.reap_dead(watched)
                reached = time.monotonic()  # reached, whatever fails later in the tick
            while dispatcher.reap(leases=watched >= lease) > 0:
                pass
            reached = time.monotonic()
            dispatcher.rewake(dispatcher.settings.rewake_after_seconds)
        except Exception as e:  # keep reaping after any transient failure
            log.warning("reaper: %s", e)
        stop.wait(interval)
