"""The RPC egress gateway: the only way out of the sandbox's network namespace.

For each RPC endpoint a task may use (an http(s) URL in its slot's env or secrets, or its
`config.rpc_url`) the trusted wrapper listens on loopback inside the sandbox and forwards JSON-RPC
POSTs to exactly that URL; the operator sees `http://127.0.0.1:<port>/` instead. So the sandbox
reaches its slot's RPC and nothing else, TLS and any API key in the URL stay outside, and the
platform's own services (the API with /internal/*, Postgres, the object store) are refused as
upstreams whatever a DAG declares.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx

MAX_BODY = 32 * 1024 * 1024
MAX_CONNECTIONS = 64


class EgressRefused(ValueError):
    pass


def is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return (parts.hostname or "").lower(), port


def _addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        found = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            found = [ipaddress.ip_address(i[4][0]) for i in socket.getaddrinfo(host, None)]
        except (OSError, ValueError):
            return []
    # ::ffff:127.0.0.1 is 127.0.0.1 (Python 3.11 does not call it loopback).
    return [
        a.ipv4_mapped if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped else a
        for a in found
    ]


def check_upstream(url: str, platform_ports: set[int]) -> None:
    """Refuses the platform's own loopback services, unspecified and link-local addresses
    (0.0.0.0 reaches loopback; 169.254.169.254 is a cloud's metadata service)."""
    host, port = host_port(url)
    if not host:
        raise EgressRefused(f"'{url}' has no host")
    for addr in _addresses(host):
        if addr.is_link_local or addr.is_unspecified or addr.is_multicast:
            raise EgressRefused(f"'{host}' ({addr}) is not an address an RPC may have")
        if addr.is_loopback and port in platform_ports:
            raise EgressRefused(
                f"'{host}:{port}' is one of the platform's own services; an operator may not "
                "reach it"
            )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that stalls mid-request loses its connection
    # TCP_NODELAY: a reply is two writes (headers, then body); with Nagle the body waits for
    # the client's delayed ACK of the headers, ~40 ms per request on a keep-alive connection,
    # which capped Cryo at a few requests in flight / 40 ms, well under its rate budget.
    disable_nagle_algorithm = True
    server: _Server

    def handle(self) -> None:
        # Bounded: a task cannot hold more than MAX_CONNECTIONS of the worker's threads.
        if not self.server.slots.acquire(blocking=False):
            # Refused before any request is read: what send_response needs is set here.
            self.requestline, self.request_version = "", self.protocol_version
            self._reply(503, b'{"error":"too many connections to the RPC gateway"}')
            return
        try:
            super().handle()
        finally:
            self.server.slots.release()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _reply(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._reply(411, b'{"error":"Content-Length required"}')
            self.close_connection = True
            return
        if int(length) > MAX_BODY:
            self._reply(413, b'{"error":"request too large"}')
            self.close_connection = True
            return
        body = self.rfile.read(int(length))
        if len(body) != int(length):
            self.close_connection = True
            return
        try:
            with self.server.client.stream(
                "POST",
                self.server.upstream,
                content=body,
                headers={"Content-Type": self.headers.get("Content-Type", "application/json")},
            ) as r:
                chunks, size = [], 0
                for chunk in r.iter_bytes():
                    size += len(chunk)
                    if size > MAX_BODY:
                        self._reply(502, b'{"error":"upstream response too large"}')
                        return
                    chunks.append(chunk)
        except httpx.HTTPError as e:
            self._reply(502, f'{{"error":"upstream: {type(e).__name__}"}}'.encode())
            return
        ctype = r.headers.get("Content-Type", "application/json")
        self._reply(r.status_code, b"".join(chunks), ctype)

    def do_GET(self) -> None:
        self._reply(405, b'{"error":"only JSON-RPC POSTs pass the gateway"}')

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_CONNECT = do_GET


@functools.cache
def verified_tls() -> ssl.SSLContext:
    """httpx's default verification context (certifi's CAs), built once (25 ms each) and
    shared by every gateway's client and the worker's client of the internal API."""
    return httpx.create_ssl_context()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, sock: socket.socket, upstream: str) -> None:
        super().__init__(sock.getsockname(), _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.upstream = upstream
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.client = httpx.Client(
            verify=verified_tls(), timeout=httpx.Timeout(120.0, connect=10.0)
        )

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # gone mid-reply: its own doing
            super().handle_error(request, client_address)


class Gateway:
    """One listener (already bound inside the sandbox) forwarding to one upstream URL."""

    def __init__(self, sock: socket.socket, upstream: str) -> None:
        self.server = _Server(sock, upstream)
        self.port = int(sock.getsockname()[1])
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def close(self) -> None:
        # Shutting the listener down first refuses new connections at once and wakes
        # serve_forever now rather than at its next poll (up to 0.2 s per gateway per task).
        with contextlib.suppress(OSError):
            self.server.socket.shutdown(socket.SHUT_RDWR)
        self.server.shutdown()
        self.server.server_close()
        self.server.client.close()
        self.thread.join(timeout=5)
