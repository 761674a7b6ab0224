"""What an operator host says, read by whoever supervises it (the worker's loop, or its
wrapper's thread) off the host's pipe itself: no reader thread between them. A reader thread cost each message two wake-ups
(the thread's, then the wrapper's, through a queue), on every task.

The wrapper's own helpers (the thread serving a store request) `post` their notes into the
same stream, in the order of arrival: after the lines already read, before any read later.
The store protocol needs the latter: its "store_done" is posted before the reply is written,
so the host's next request, which follows the reply, comes after it."""

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
_EXIT_WAIT = 5.0  # seconds an end of output waits for the host's exit before saying so
_DRAIN_READS = 64  # reads of what a host wrote before it exited (a descendant may write on)
# What the reader is told by this link or the wrapper (`post`), never by the host itself.
POSTED_ONLY = frozenset({"exit", "protocol_error", "store_done"})


class HostLink:
    """One host process's messages, for one reader (`get`) and any number of posters.

    The host's exit is watched too (a pidfd): an exit with its output still held open (by a
    process it started) is seen, and an end of output waits for the exit without blocking."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self._fd = proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self._pidfd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # no pidfd (old kernel): the exit is polled for
            self._pidfd = None
        self._poll = select.poll()  # not select(): no limit on the descriptors' numbers
        self._watched: set[int] = set()
        for fd in (self._fd, self._wake_r, self._pidfd):
            if fd is not None:
                self._poll.register(fd, select.POLLIN)
                self._watched.add(fd)
        self._lock = threading.Lock()
        # Lines read (bytes, parsed when taken) and posted notes (dicts), in arrival order.
        self._queue: collections.deque[bytes | dict[str, Any]] = collections.deque()
        self._partial: list[bytes] = []  # the line being read: its pieces, joined once whole
        self._partial_len = 0
        self._output_ended: float | None = None  # when, if the host is still running
        # What the reader gets once the queue is empty: reading has stopped.
        self._last: dict[str, Any] | None = None
        self._closed = False

    def fds(self) -> list[int]:
        """The descriptors `get` waits on, for a caller that waits on many links at once (and
        then calls `get(0)` on those ready)."""
        return list(self._watched)

    def post(self, msg: dict[str, Any]) -> None:
        """From any thread: `msg` goes to the reader after the lines read so far."""
        with self._lock:
            if self._closed:
                return
            self._queue.append(msg)
            with contextlib.suppress(BlockingIOError):  # a wake-up already pending is enough
                os.write(self._wake_w, b"\0")

    def get(self, timeout: float) -> dict[str, Any] | None:
        """The next message, waiting up to `timeout` seconds (None: nothing came; what the
        pipe already holds is always looked at, even with no time left). A line over MAX_LINE
        bytes, or one that is not a JSON object, is a protocol error and ends the reading
        (nothing unbounded is buffered); the host's exit, or the end of its output, is an
        `exit` (`returncode` None: it closed its output and runs on)."""
        deadline = time.monotonic() + timeout
        late = False
        while True:
            with self._lock:
                item = self._queue.popleft() if self._queue else None
            if isinstance(item, dict):
                return item
            if item is not None:
                return self._parse(item)
            if self._last is not None:
                return self._last
            if late:
                return None
            left = deadline - time.monotonic()
            late = left <= 0  # one look at what is there, then an answer
            wait = max(0.0, left)
            if self._pidfd is None:  # the exit is polled for (a descendant may hold the pipe)
                wait = min(wait, 0.05 if self._output_ended is not None else 0.5)
            if self._output_ended is not None:
                wait = min(wait, max(0.0, self._output_ended + _EXIT_WAIT - time.monotonic()))
            for fd, _ in self._poll.poll(wait * 1000):
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                elif fd == self._pidfd:
                    self._exited()
                elif fd == self._fd and self._last is None:
                    # Until a line is whole: a line longer than one read (or the pipe)
                    # comes in one `get`, even with no time left.
                    self._drain(until_a_line=True)
            no_exit_watch = self._pidfd is None and self._output_ended is None
            if no_exit_watch and self._last is None and self.proc.poll() is not None:
                self._exited()
            self._check_exit()

    def _read(self) -> bool:
        """One read of the host's output into lines; False when there was nothing to read."""
        try:
            chunk = os.read(self._fd, _CHUNK)
        except BlockingIOError:
            return False
        if not chunk:
            self._end_of_output()
            return False
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:  # no line ends here: only the new bytes are looked at
            self._partial.append(chunk)
            self._partial_len += len(chunk)
        else:
            self._partial.append(pieces[0])
            lines = [b"".join(self._partial), *pieces[1:-1]]
            self._partial, self._partial_len = [pieces[-1]], len(pieces[-1])
            with self._lock:
                self._queue.extend(lines)
        if self._partial_len > MAX_LINE:
            self._partial, self._partial_len = [], 0
            self._stop({"type": "protocol_error", "error": f"a message over {MAX_LINE} bytes"})
        return True

    def _drain(self, until_a_line: bool) -> None:
        """Reads until the pipe is empty (or a line is queued), at most _DRAIN_READS times:
        a host, or a process it started, writing on cannot keep the reader here."""
        for _ in range(_DRAIN_READS):
            if self._last is not None or self._fd not in self._watched or not self._read():
                return
            if until_a_line and self._queue:
                return

    def _flush_partial(self) -> None:
        """The host's last line, without its newline, still counts."""
        if self._partial_len:
            with self._lock:
                self._queue.append(b"".join(self._partial))
            self._partial, self._partial_len = [], 0

    def _end_of_output(self) -> None:
        self._flush_partial()
        self._unwatch(self._fd)
        self._output_ended = time.monotonic()
        self._check_exit()

    def _exited(self) -> None:
        """The host ended: what it wrote before, then its exit."""
        if self._pidfd is not None:
            self._unwatch(self._pidfd)
        self._drain(until_a_line=False)
        if self._last is None:
            self._flush_partial()
            self._stop({"type": "exit", "returncode": self.proc.wait()})

    def _check_exit(self) -> None:
        """After the end of the output: the exit status once the host has one, or None past
        _EXIT_WAIT (it runs on, and can say nothing more: the wrapper kills it)."""
        if self._output_ended is None or self._last is not None:
            return
        code = self.proc.poll()
        if code is not None or time.monotonic() >= self._output_ended + _EXIT_WAIT:
            self._stop({"type": "exit", "returncode": code})

    def _parse(self, line: bytes) -> dict[str, Any]:
        if len(line) > MAX_LINE:
            return self._refuse(f"a message over {MAX_LINE} bytes")
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the stack
            msg = None
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            return self._refuse("a message that is not a JSON object")
        if msg["type"] in POSTED_ONLY:
            return self._refuse(f"a {msg['type']!r} message, which only the wrapper posts")
        return msg

    def _refuse(self, why: str) -> dict[str, Any]:
        """A protocol error: nothing after it is read."""
        with self._lock:
            self._queue.clear()
        last = {"type": "protocol_error", "error": why}
        self._stop(last)
        return last

    def _stop(self, last: dict[str, Any]) -> None:
        self._last = last
        self._unwatch(self._fd)

    def _unwatch(self, fd: int) -> None:
        if fd in self._watched:
            self._watched.discard(fd)
            self._poll.unregister(fd)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.clear()
        self._stop({"type": "exit", "returncode": self.proc.poll()})  # a get after close
        for fd in (self._wake_r, self._wake_w, self._pidfd):
            if fd is not None:
                os.close(fd)
