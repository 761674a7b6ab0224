"""`GET /metrics` of one registry on a listener of its own (the API's TRACE_METRICS_PORT, a
worker's TRACE_WORKER_METRICS_PORT): a thread per connection, beside whatever the process
serves, so a scrape never waits behind the API's requests nor they behind it.

Anyone who can reach the port can read it, without a key: it is for the operators' network
(Prometheus scrapes it), never to be published where users reach the API. What it shows is
platform-wide (counts by status, queue, state, dataset uuid), never a user's names or data.
Over TLS with the API's certificate when it has one (each handshake on its connection's own
thread, so a client that never finishes one holds up no other)."""

from __future__ import annotations

import socket
import socketserver
import ssl
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from trace_platform.threaded_server import ThreadedServer

PATH = "/metrics"
CONNECTION_SECONDS = 10.0  # a connection that sends no request in this long is closed


class _Handler(WSGIRequestHandler):
    timeout = CONNECTION_SECONDS

    def log_message(self, format: str, *args: Any) -> None:
        pass  # Prometheus scrapes every few seconds: not worth a log line each


class _Server(ThreadingWSGIServer):
    tls: ssl.SSLContext | None = None

    def server_bind(self) -> None:
        # HTTPServer's also looks the host's name up (getfqdn): a DNS wait for nothing here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]
        self.setup_environ()

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        if self.tls is not None:
            # The handshake happens at the handler's first read, on its own thread.
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a scraper that went away, a failed handshake: nothing to print


def _only_metrics(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"only /metrics is served here\n"]
        return app(environ, start_response)

    return serve


class MetricsServer(ThreadedServer[WSGIServer]):
    """`registry` on `host:port` (port 0: any free one) until `stop`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        server_class = type(
            "_BoundServer",
            (_Server,),
            {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET, "tls": tls},
        )
        server = make_server(
            host, port, _only_metrics(make_wsgi_app(registry)), server_class, _Handler
        )
        super().__init__(server, "metrics")
