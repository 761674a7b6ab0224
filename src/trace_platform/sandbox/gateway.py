"""The RPC egress gateway: the only way out of the sandbox's network namespace.

For each RPC endpoint a task may use (an http(s) URL in its slot's env or secrets, or its
`config.rpc_url`) the trusted wrapper listens on loopback inside the sandbox and forwards JSON-RPC
POSTs to exactly that URL; the operator sees `http://127.0.0.1:<port>/` instead. So the sandbox
reaches its slot's RPC and nothing else, TLS and any API key in the URL stay outside, and the
platform's own services (the API with /internal/*, Postgres, the object store) are refused as
upstreams whatever a DAG declares.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx

log = logging.getLogger(__name__)
MAX_BODY = 32 * 1024 * 1024


class EgressRefused(ValueError):
    pass


def is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return (parts.hostname or "").lower(), port


def _is_local(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback or ipaddress.ip_address(host).is_unspecified
    except ValueError:
        try:
            return any(
                ipaddress.ip_address(info[4][0]).is_loopback
                for info in socket.getaddrinfo(host, None)
            )
        except OSError:
            return False


def check_upstream(url: str, platform_ports: set[int]) -> None:
    host, port = host_port(url)
    if not host:
        raise EgressRefused(f"'{url}' has no host")
    if _is_local(host) and port in platform_ports:
        raise EgressRefused(
            f"'{host}:{port}' is one of the platform's own services; an operator may not reach it"
        )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

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
        try:
            r = self.server.client.post(
                self.server.upstream,
                content=body,
                headers={"Content-Type": self.headers.get("Content-Type", "application/json")},
            )
        except httpx.HTTPError as e:
            self._reply(502, f'{{"error":"upstream: {type(e).__name__}"}}'.encode())
            return
        self._reply(r.status_code, r.content, r.headers.get("Content-Type", "application/json"))

    def do_GET(self) -> None:
        self._reply(405, b'{"error":"only JSON-RPC POSTs pass the gateway"}')

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_CONNECT = do_GET


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, sock: socket.socket, upstream: str) -> None:
        super().__init__(sock.getsockname(), _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.upstream = upstream
        self.client = httpx.Client(timeout=httpx.Timeout(120.0, connect=10.0))


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
        self.server.shutdown()
        self.server.server_close()
        self.server.client.close()
        self.thread.join(timeout=5)
