"""Named crash points for chaos tests: `TRACE_FAULTS=outbox.after_publish` makes the process
SIGKILL itself when it reaches that point, exactly as a real crash would. Off by default."""

from __future__ import annotations

import os
import signal

_ACTIVE = frozenset(filter(None, os.environ.get("TRACE_FAULTS", "").split(",")))


def point(name: str) -> None:
    if name in _ACTIVE:
        os.kill(os.getpid(), signal.SIGKILL)
