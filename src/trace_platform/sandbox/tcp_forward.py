"""A byte-for-byte TCP forward from a listener inside the sandbox to one upstream address: how a
sandboxed operator host reaches its Spark Connect endpoint (gRPC over HTTP/2, so not the RPC
gateway's JSON POSTs) and nothing else. The upstream is fixed by the worker's configuration,
never by the task, and checked against the platform's own ports like any RPC upstream."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit

MAX_CONNECTIONS = 16
CONNECT_PORT = 15002  # Spark Connect's default


def connect_address(url: str) -> tuple[str, int, str]:
    """`sc://host[:port][/;params]` -> (host, port, the rest of the URL after host:port)."""
    parts = urlsplit(url)
    if parts.scheme != "sc" or not parts.hostname:
        raise ValueError(f"'{url}' is not a Spark Connect URL (sc://host:port)")
    rest = url.split(parts.netloc, 1)[1]
    return parts.hostname, parts.port or CONNECT_PORT, rest


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class TcpForward:
    """Accepts on `sock` (already bound in the sandbox) and pipes each connection to
    (`host`, `port`), at most MAX_CONNECTIONS at a time."""

    def __init__(self, sock: socket.socket, host: str, port: int) -> None:
        self.sock = sock
        self.upstream = (host, port)
        self.port = int(sock.getsockname()[1])
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.closed = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                inner, _ = self.sock.accept()
            except OSError:  # closed
                return
            if not self.slots.acquire(blocking=False):
                inner.close()
                continue
            threading.Thread(target=self._serve, args=(inner,), daemon=True).start()

    def _serve(self, inner: socket.socket) -> None:
        try:
            outer = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            inner.close()
            self.slots.release()
            return
        outer.settimeout(None)
        # A relay must not hold bytes back: with Nagle a small write queued behind an unacked
        # one waits for the peer's delayed ACK (~40 ms), on each side of the forward.
        for s in (inner, outer):
            with contextlib.suppress(OSError):  # a peer already gone fails in the pumps
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.lock:
            if self.closed:
                inner.close()
                outer.close()
                self.slots.release()
                return
            self.open.update((inner, outer))
        back = threading.Thread(target=_pump, args=(outer, inner), daemon=True)
        back.start()
        _pump(inner, outer)
        back.join()
        with self.lock:
            self.open.difference_update((inner, outer))
        inner.close()
        outer.close()
        self.slots.release()

    def close(self) -> None:
        """Stops accepting and cuts every open connection (the task is over)."""
        with self.lock:
            self.closed = True
            conns = list(self.open)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=5)
