from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 30.0, what: str = "condition") -> T:
    """Polls `check` until it returns something truthy; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def exit_code(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """`proc.wait(timeout)`; a worker still running then is first asked for its threads'
    stacks (SIGUSR1, faulthandler: into its log) so the failure says where it waited."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        raise
