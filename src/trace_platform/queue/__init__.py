"""Queue drivers: one protocol (`driver.QueueDriver`), pgqueue for Lite, SQS for AWS."""

from __future__ import annotations

from trace_platform.config import QueueBackend, Settings
from trace_platform.queue.driver import Message, QueueDriver

__all__ = ["Message", "QueueDriver", "make_driver"]


def make_driver(settings: Settings, dsn: str) -> QueueDriver:
    if settings.queue_driver is QueueBackend.pgqueue:
        from trace_platform.queue.pgqueue import PgQueue

        return PgQueue.from_dsn(
            dsn, max_attempts=settings.queue_max_attempts, poll_seconds=settings.queue_poll_seconds
        )
    raise NotImplementedError(
        f"queue driver '{settings.queue_driver}' is not built yet; use TRACE_QUEUE_DRIVER=pgqueue"
    )
