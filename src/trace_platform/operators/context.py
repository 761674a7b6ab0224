"""What an operator sees: its task (never the lease token), config, and a way to emit events."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_platform.dispatcher.models import EventIn, OutputCommit, TaskPayload
from trace_platform.objectstore import ObjectStore


@dataclass
class OperatorResult:
    """What an operator returns: final events (sent atomically with the completion) and the
    output pieces it committed (attempt-fenced by the Dispatcher)."""

    events: list[EventIn] = field(default_factory=list)
    outputs: list[OutputCommit] = field(default_factory=list)
    state: dict[str, Any] | None = None  # the job's new durable state, saved on success


class OperatorError(Exception):
    """A failure worth retrying (the default for any exception)."""

    retryable = True


class PermanentError(OperatorError):
    """A failure no retry can fix (bad config, bad input): the task fails at once."""

    retryable = False


@dataclass
class OperatorContext:
    task: TaskPayload
    workdir: Path
    _send: Callable[[dict[str, Any]], None]
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("trace.operator"))

    @property
    def config(self) -> dict[str, Any]:
        return self.task.config

    def emit(self, event: EventIn | dict[str, Any]) -> None:
        """Emit an event now (mid-task); the wrapper forwards it, attempt-fenced."""
        ev = event if isinstance(event, EventIn) else EventIn.model_validate(event)
        self._send({"type": "event", "event": ev.model_dump(mode="json")})

    @property
    def spark(self) -> Any:
        """The host's long-lived SparkSession (created on first use)."""
        from trace_platform.spark import get_spark

        return get_spark()

    @functools.cached_property
    def store(self) -> ObjectStore:
        """The platform object store (configured by the wrapper for this task's run); built and
        bootstrapped once per task, however often an operator reaches for it."""
        from trace_platform.config import Settings
        from trace_platform.objectstore import make_store

        store = make_store(Settings())
        store.ensure_bucket()
        return store

    def progress(self, **values: Any) -> None:
        """Progress shown with the task; sent with the next heartbeat."""
        self._send({"type": "progress", "progress": values})
