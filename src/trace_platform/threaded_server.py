"""A socketserver server served on a daemon thread of its own, from `start` until `stop`: the
lifecycle the metrics listener (metrics/server.py) and the exchange listener
(api/exchange_listener.py) share."""

from __future__ import annotations

import socketserver
import threading
from typing import Generic, Self, TypeVar

S = TypeVar("S", bound=socketserver.TCPServer)


class ThreadedServer(Generic[S]):
    """`server` (bound already, port 0: any free one) on a thread named `name`."""

    def __init__(self, server: S, name: str) -> None:
        self.server = server
        self.thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.thread.is_alive():  # shutdown() waits for a serve_forever that runs
            self.server.shutdown()
        self.server.server_close()
        self.closed()
        self.thread.join(timeout=5)

    def closed(self) -> None:
        """Called once the listening socket is closed, before the thread is joined: what a
        server does with the connections it still has open."""
