"""Frames between the API process and a query worker, over a pair of pipes.

A frame is `>IQ` (header length, payload length), a JSON header, then the payload bytes (Arrow
IPC, or an encoded export). JSON both ways: the API process never unpickles anything a worker
(which runs user SQL) wrote, and it checks both lengths before it reads a byte of the rest."""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

HEAD = struct.Struct(">IQ")
MAX_HEADER = 4 * 1024 * 1024


class Closed(Exception):
    """The other end closed its pipe (a worker that exited or was killed)."""


class TimedOut(Exception):
    """Nothing complete arrived before the deadline."""


class TooLarge(Exception):
    """A frame announced more than the reader accepts."""

    def __init__(self, size: int) -> None:
        super().__init__(f"frame of {size} bytes")
        self.size = size


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def send(fd: int, header: dict[str, Any], payload: Any = b"") -> None:
    """Writes one frame; payload is anything with the buffer protocol (bytes, pyarrow.Buffer)."""
    head = json.dumps(header, separators=(",", ":")).encode()
    size = memoryview(payload).nbytes
    _write_all(fd, HEAD.pack(len(head), size) + head)
    if size:
        _write_all(fd, payload)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    poller = None
    if deadline is not None:
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while got < n:
        if poller is not None and deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(max(1, int(left * 1000))):
                if time.monotonic() >= deadline:
                    raise TimedOut()
                continue
        k = os.readv(fd, [view[got:]])
        if k == 0:
            raise Closed()
        got += k
    return buf


def recv(
    fd: int, *, deadline: float | None = None, max_payload: int | None = None
) -> tuple[dict[str, Any], bytearray]:
    """Reads one frame (deadline: a time.monotonic() value). Raises Closed on EOF, TimedOut,
    or TooLarge when the frame announces more than max_payload bytes (nothing of it read)."""
    hlen, plen = HEAD.unpack(_read_exact(fd, HEAD.size, deadline))
    if hlen > MAX_HEADER:
        raise TooLarge(hlen)
    if max_payload is not None and plen > max_payload:
        raise TooLarge(plen)
    header = json.loads(_read_exact(fd, hlen, deadline))
    if not isinstance(header, dict):
        raise ValueError("a frame header must be a JSON object")
    payload = _read_exact(fd, plen, deadline) if plen else bytearray()
    return header, payload
