"""What an operator sees: its task (never the lease token), config, and a way to emit events."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_platform.dispatcher.models import EventIn, TaskPayload


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

    def progress(self, **values: Any) -> None:
        """Progress shown with the task; sent with the next heartbeat."""
        self._send({"type": "progress", "progress": values})
