"""A queue driver that is away for its first few receives (an SQS outage, a throttle), then
the real one: for the loops that must outlive a queue outage."""

from __future__ import annotations

import threading
from typing import Any

from trace_platform.queue.driver import Message, QueueDriver, QueueUnavailable


class AwayFirst:
    def __init__(self, driver: QueueDriver, failures: int) -> None:
        self.driver = driver
        self._receive = driver.receive  # the real one, also once `receive` is patched over
        self.left = failures
        self.refused = 0
        self._lock = threading.Lock()

    def receive(self, *args: Any, **kwargs: Any) -> list[Message]:
        with self._lock:
            if self.left > 0:
                self.left -= 1
                self.refused += 1
                raise QueueUnavailable("SQS receive: the queue is away (test outage)")
        return self._receive(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver, name)
