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
    # Since when this reaper has watched the registry without a gap: a worker is declared dead
    # only for a silence seen here, not for one while this process (or the database) was away
    # and no beat could land (an API back from a restart would otherwise end the whole fleet).
    watching: float | None = None
    while not stop.is_set():
        seen = False
        try:
            if time.monotonic() - last_partitions > _PARTITIONS_EVERY:
                ensure_partitions(dispatcher)
                if registry is not None:
                    registry.prune()
                last_partitions = time.monotonic()
            if registry is not None:
                watching = time.monotonic() if watching is None else watching
                registry.reap_dead(time.monotonic() - watching)
            seen = True
            while dispatcher.reap() > 0:
                pass
            dispatcher.rewake(dispatcher.settings.rewake_after_seconds)
        except Exception as e:  # keep reaping after any transient failure
            log.warning("reaper: %s", e)
        if not seen:  # the registry was not reached: the watch starts again
            watching = None
        stop.wait(interval)
