"""The reaper loop and partition upkeep: both safe to run in every Dispatcher process."""

from __future__ import annotations

import logging
import threading
import time

from trace_platform.dispatcher.core import Dispatcher

log = logging.getLogger(__name__)
_PARTITIONS_EVERY = 6 * 3600.0


def ensure_partitions(dispatcher: Dispatcher) -> int:
    return dispatcher.store.ensure_partitions()


def run_reaper(dispatcher: Dispatcher, stop: threading.Event, interval: float = 1.0) -> None:
    last_partitions = 0.0
    while not stop.is_set():
        try:
            if time.monotonic() - last_partitions > _PARTITIONS_EVERY:
                ensure_partitions(dispatcher)
                last_partitions = time.monotonic()
            while dispatcher.reap() > 0:
                pass
            dispatcher.rewake(dispatcher.settings.rewake_after_seconds)
        except Exception as e:  # keep reaping after any transient failure
            log.warning("reaper: %s", e)
        stop.wait(interval)
