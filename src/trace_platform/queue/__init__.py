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
    if settings.queue_driver is QueueBackend.sqs:
        from trace_platform.queue.sqs import SqsQueue

        return SqsQueue.from_settings(settings)  # state stays in Postgres: no DSN here
    raise NotImplementedError(f"queue driver '{settings.queue_driver}' is not built")
