"""What an operator host says, read by the wrapper thread that supervises it, off the host's
pipe itself: no reader thread between them. A reader thread cost each message two wake-ups
(the thread's, then the wrapper's, through a queue), on every task.

The wrapper's own helpers (the thread serving a store request) `post` their notes into the
same stream; a note posted comes before any host line read after it, which is the order the
store protocol needs (its "store_done" is posted before the reply the host answers)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import subprocess
import threading
import time
from typing import Any

MAX_LINE = 16 * 1024 * 1024  # one host message (a task's final events fit many times over)
_CHUNK = 256 * 1024
_EXIT_WAIT = 5.0  # seconds the end of a host's output waits for its exit status


class HostLink:
    """One host process's messages, for one reader (`get`) and any number of posters."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self._fd = proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poll = select.poll()  # not select(): no limit on the descriptors' numbers
        self._poll.register(self._fd, select.POLLIN)
        self._poll.register(self._wake_r, select.POLLIN)
        self._lock = threading.Lock()
        self._posted: collections.deque[dict[str, Any]] = collections.deque()
        self._lines: collections.deque[bytes] = collections.deque()
        self._partial = b""
        # What the reader gets once the lines read are used up: reading has stopped.
        self._last: dict[str, Any] | None = None
        self._closed = False

    def post(self, msg: dict[str, Any]) -> None:
        """From any thread: `msg` goes to the reader before any host line read after this."""
        with self._lock:
            if self._closed:
                return
            self._posted.append(msg)
            with contextlib.suppress(BlockingIOError):  # a wake-up already pending is enough
                os.write(self._wake_w, b"\0")

    def get(self, timeout: float) -> dict[str, Any] | None:
        """The next message, waiting up to `timeout` seconds (None: nothing came). A line over
        MAX_LINE bytes, or one that is not a JSON object, is a protocol error and ends the
        reading (nothing unbounded is buffered); the end of the output is an `exit`."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._posted:
                    return self._posted.popleft()
            if self._lines:
                return self._parse(self._lines.popleft())
            if self._last is not None:
                return self._last
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            for fd, _ in self._poll.poll(left * 1000):
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                else:
                    self._read()

    def _read(self) -> None:
        try:
            chunk = os.read(self._fd, _CHUNK)
        except BlockingIOError:
            return
        if not chunk:  # the end of the output: a last line without its newline still counts
            if self._partial:
                self._lines.append(self._partial)
                self._partial = b""
            self._stop({"type": "exit", "returncode": self._exit_status()})
            return
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        self._lines.extend(lines)
        if len(self._partial) > MAX_LINE:
            self._partial = b""
            self._stop({"type": "protocol_error", "error": f"a message over {MAX_LINE} bytes"})

    def _parse(self, line: bytes) -> dict[str, Any]:
        if len(line) > MAX_LINE:
            return self._refuse(f"a message over {MAX_LINE} bytes")
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            return self._refuse("a message that is not a JSON object")
        return msg

    def _refuse(self, why: str) -> dict[str, Any]:
        """A protocol error: nothing after it is read."""
        self._lines.clear()
        self._stop({"type": "protocol_error", "error": why})
        return self._last  # type: ignore[return-value]

    def _stop(self, last: dict[str, Any]) -> None:
        if self._last is None:
            self._poll.unregister(self._fd)
        self._last = last

    def _exit_status(self) -> int | None:
        """The host's exit status; None for a host that closed its output and runs on (it
        can say nothing more: the wrapper kills it)."""
        try:
            return self.proc.wait(timeout=_EXIT_WAIT)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        os.close(self._wake_r)
        os.close(self._wake_w)
