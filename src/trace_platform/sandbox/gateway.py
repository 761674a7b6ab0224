"""The RPC egress gateway: the only way out of the sandbox's network namespace.

For each RPC endpoint a task may use (an http(s) URL in its slot's env or secrets, or its
`config.rpc_url`) the trusted wrapper listens on loopback inside the sandbox and forwards JSON-RPC
POSTs to exactly that URL; the operator sees `http://127.0.0.1:<port>/` instead. So the sandbox
reaches its slot's RPC and nothing else, TLS and any API key in the URL stay outside, and the
platform's own services (the API with /internal/*, Postgres, the object store) are refused as
upstreams whatever a DAG declares.

An upstream must be a public address: loopback, private, link-local, multicast, reserved and
unresolvable targets are refused unless the admin lists them (`TRACE_EGRESS_ALLOW`, host[:port]
entries). Each name is resolved once, when checked, and every connection goes to that checked
address (the name stays the Host header and the TLS server name), so a DNS answer that changes
later (rebinding) cannot point the gateway elsewhere.

A task has at most `MAX_URLS` upstreams by default (the worker's `TRACE_EGRESS_MAX_URLS`) and
`MAX_CONNECTIONS` open connections over all of them. One thread per worker process accepts on
every gateway's listener (`_Hub`); a thread serves a connection only while it is open.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import httpx

log = logging.getLogger(__name__)

MAX_BODY = 32 * 1024 * 1024
MAX_CONNECTIONS = 64  # per task, over all its gateways
MAX_URLS = 16  # per task, unless the worker's settings say otherwise
# How long all of a task's names may take to resolve, together (a hostile DNS server can take
# its time on each): what has not answered by then is refused, retryably.
RESOLVE_SECONDS = 10.0

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Allow = frozenset[tuple[str, int | None]]


class EgressRefused(ValueError):
    """An upstream the task may not use. `retryable`: only a resolver that did not answer in
    time, which a later attempt may not meet again."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


def is_url(value: str) -> bool:
    return value.startswith(("http://", "https://"))


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return (parts.hostname or "").lower(), port


def parse_allow(entries: Iterable[str]) -> Allow:
    """`host[:port]` entries (an IPv6 address in brackets when a port follows): a host alone
    allows each of its ports. IP addresses are normalised (`127.000.0.1` is `127.0.0.1`)."""
    out: set[tuple[str, int | None]] = set()
    for raw in entries:
        entry = raw.strip().lower()
        if not entry:
            continue
        try:
            out.add((str(ipaddress.ip_address(entry.strip("[]"))), None))  # a bare address
            continue
        except ValueError:
            pass
        parts = urlsplit(f"//{entry}")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"'{raw}' is not host[:port]") from None
        if not parts.hostname:
            raise ValueError(f"'{raw}' is not host[:port]")
        out.add((_normal(parts.hostname), port))
    return frozenset(out)


def _normal(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _allowed(allow: Allow, host: str, port: int) -> bool:
    host = _normal(host)
    return (host, port) in allow or (host, None) in allow


def _unmapped(a: Address) -> Address:
    # ::ffff:127.0.0.1 is 127.0.0.1 (Python 3.11 does not call it loopback).
    return a.ipv4_mapped if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped else a


def _addresses(host: str) -> list[Address]:
    """Every address `host` resolves to (an IP literal: itself); [] if it does not resolve.
    `socket.gaierror` other than "no such name" is raised (the resolver did not answer)."""
    try:
        return [_unmapped(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        if e.errno in (socket.EAI_AGAIN, getattr(socket, "EAI_SYSTEM", -11)):
            raise
        return []
    except (OSError, UnicodeError):
        return []
    found: list[Address] = []
    for info in infos:
        with contextlib.suppress(ValueError):
            a = _unmapped(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
            if a not in found:
                found.append(a)
    return found


# IPv6 prefixes that carry an IPv4 address a translator may deliver to (NAT64, 6to4).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def public(a: Address) -> bool:
    """Whether `a` is a globally routed unicast address (no loopback, private, shared, link-local,
    multicast, reserved or documentation range, nor one hidden in an IPv6 translation prefix)."""
    if not a.is_global or a.is_multicast or a.is_reserved or a.is_unspecified:
        return False
    if isinstance(a, ipaddress.IPv6Address):
        inner: ipaddress.IPv4Address | None = a.sixtofour
        if inner is None and a in _NAT64:
            inner = ipaddress.IPv4Address(int(a) & 0xFFFFFFFF)
        if inner is None and a.teredo is not None:
            inner = a.teredo[1]
        if inner is not None:
            return public(inner)
    return True


@dataclass(frozen=True)
class Upstream:
    """A checked upstream: every connection goes to `address` (the address the check saw), with
    `host` as the Host header and TLS server name. `address` None: an admin-allowed name that
    did not resolve when checked; each request checks and pins it again."""

    url: str
    host: str
    port: int
    address: str | None

    def request(self) -> tuple[httpx.URL, dict[str, str], dict[str, Any]]:
        """The URL to send to (its host replaced by the checked address), the Host header and
        httpx's extensions (the TLS server name)."""
        url = httpx.URL(self.url)
        if self.address is None:
            raise EgressRefused(f"'{self.host}' has no checked address")
        # Host and port as checked, whatever httpx would make of the URL itself.
        pinned = url.copy_with(host=self.address, port=self.port)
        if _normal(self.host) == self.address:
            return pinned, {}, {}
        extensions: dict[str, Any] = {}
        if url.scheme == "https":
            extensions["sni_hostname"] = self.host
        host_header = url.netloc.decode("ascii").rsplit("@", 1)[-1]
        return pinned, {"Host": host_header}, extensions


def check_upstream(url: str, platform_ports: set[int], allow: Allow = frozenset()) -> Upstream:
    """The upstream `url` names, checked and pinned to the address checked. Never: the platform's
    own loopback services, an unspecified address (0.0.0.0 reaches loopback). Unless `allow`
    lists it: a name that does not resolve, and any address that is not public (loopback,
    private, link-local such as a cloud's metadata service 169.254.169.254, multicast,
    reserved)."""
    host, port = host_port(url)
    if not host:
        raise EgressRefused(f"'{url}' has no host")
    try:
        addrs = _addresses(host)
    except OSError as e:
        raise EgressRefused(f"'{host}' could not be resolved now ({e})", retryable=True) from None
    return _checked(url, host, port, addrs, platform_ports, allow)


def _checked(
    url: str, host: str, port: int, addrs: list[Address], platform_ports: set[int], allow: Allow
) -> Upstream:
    for a in addrs:
        if a.is_unspecified:
            raise EgressRefused(f"'{host}' ({a}) is not an address an RPC may have")
        if a.is_loopback and port in platform_ports:
            raise EgressRefused(
                f"'{host}:{port}' is one of the platform's own services; an operator may not "
                "reach it"
            )
    named = _allowed(allow, host, port)
    if not addrs:
        if named:  # the admin's own name (an internal one, say): checked again per request
            return Upstream(url, host, port, None)
        raise EgressRefused(
            f"'{host}' does not resolve; an admin may allow it with TRACE_EGRESS_ALLOW={host}:{port}"
        )
    for a in addrs:
        if not named and not public(a) and not _allowed(allow, str(a), port):
            raise EgressRefused(
                f"'{host}' ({a}) is not an address an RPC may have: loopback, private, "
                "link-local, multicast and reserved addresses are refused unless an admin allows "
                f"the upstream (TRACE_EGRESS_ALLOW={host}:{port})"
            )
    return Upstream(url, host, port, str(addrs[0]))


def check_all(
    urls: Iterable[str],
    platform_ports: set[int],
    allow: Allow = frozenset(),
    timeout: float = RESOLVE_SECONDS,
) -> dict[str, Upstream]:
    """`check_upstream` of each URL, their names resolved side by side within `timeout` seconds
    in all (a thread per name, at most the task's URL cap): a name the resolver has not answered
    by then is refused, retryably."""
    todo = sorted(set(urls))
    hosts = {host_port(u)[0] for u in todo}
    answers: dict[str, list[Address] | BaseException] = {}
    done = threading.Condition()

    def resolve(name: str) -> None:
        try:
            got: list[Address] | BaseException = _addresses(name)
        except BaseException as e:  # answered, with an error: the check says so
            got = e
        with done:
            answers[name] = got
            done.notify_all()

    for name in sorted(hosts):
        if name:
            threading.Thread(target=resolve, args=(name,), name="egress-dns", daemon=True).start()
    deadline = time.monotonic() + timeout
    with done:
        done.wait_for(
            lambda: len(answers) >= len(hosts - {""}), max(0.0, deadline - time.monotonic())
        )
        answered = dict(answers)
    out: dict[str, Upstream] = {}
    for url in todo:
        host, port = host_port(url)
        if not host:
            raise EgressRefused(f"'{url}' has no host")
        got = answered.get(host)
        if got is None:
            raise EgressRefused(f"'{host}' did not resolve within {timeout:.0f} s", retryable=True)
        if isinstance(got, BaseException):
            raise EgressRefused(f"'{host}' could not be resolved now ({got})", retryable=True)
        out[url] = _checked(url, host, port, got, platform_ports, allow)
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that stalls mid-request loses its connection
    # TCP_NODELAY: a reply is two writes (headers, then body); with Nagle the body waits for
    # the client's delayed ACK of the headers, ~40 ms per request on a keep-alive connection,
    # which capped Cryo at a few requests in flight / 40 ms, well under its rate budget.
    disable_nagle_algorithm = True
    server: _Route  # type: ignore[assignment]

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
            url, headers, extensions = self.server.target().request()
        except EgressRefused:
            self._reply(502, b'{"error":"upstream does not resolve to an allowed address"}')
            return
        headers["Content-Type"] = self.headers.get("Content-Type", "application/json")
        try:
            with self.server.group.client().stream(
                "POST", url, content=body, headers=headers, extensions=extensions
            ) as r:
                chunks, size = [], 0
                for chunk in r.iter_bytes():
                    size += len(chunk)
                    if size > MAX_BODY:
                        self._reply(502, b'{"error":"upstream response too large"}')
                        return
                    chunks.append(chunk)
        except (httpx.HTTPError, RuntimeError) as e:  # RuntimeError: closed, the task over
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


_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: 52\r\nConnection: close\r\n\r\n"
    b'{"error":"too many connections to the RPC gateway"}\n'
)
# A refused connection is drained a while before it is closed (a close with its request still
# unread would reset it, and the client could lose the 503), at most this many at a time.
_DRAIN_SECONDS, _MAX_DRAINING = 2.0, 256


class _Route:
    """One listener's upstream, in its task's `Gateways` (what a handler calls its server)."""

    def __init__(self, group: Gateways, upstream: Upstream) -> None:
        self.group = group
        self.upstream = upstream

    def target(self) -> Upstream:
        if self.upstream.address is not None:
            return self.upstream
        # An admin-allowed name that did not resolve at the check: checked and pinned now.
        up = check_upstream(self.upstream.url, self.group.platform_ports, self.group.allow)
        if up.address is None:
            raise EgressRefused(f"'{up.host}' does not resolve")
        return up


class _Hub:
    """One thread accepting on every gateway listener of this process (a thread per gateway
    cost a worker 3,766 threads for one hostile slot)."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._draining: dict[socket.socket, float] = {}

    def add(self, sock: socket.socket, route: _Route) -> None:
        sock.setblocking(False)
        with self._lock:
            self._sel.register(sock, selectors.EVENT_READ, route)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="egress-hub", daemon=True)
                self._thread.start()
        self._wake()

    def remove(self, sock: socket.socket) -> None:
        with self._lock, contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(sock)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: it wakes anyway
            self._wake_w.send(b"\0")

    def _refuse(self, conn: socket.socket) -> None:
        """A connection over its task's limit: a 503, then drained until the client closes."""
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            conn.send(_BUSY)
            conn.shutdown(socket.SHUT_WR)
        if len(self._draining) >= _MAX_DRAINING:
            conn.close()
            return
        with self._lock:
            self._sel.register(conn, selectors.EVENT_READ, conn)
        self._draining[conn] = time.monotonic() + _DRAIN_SECONDS

    def _drained(self, conn: socket.socket) -> None:
        try:
            if conn.recv(65536):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._close_drained(conn)

    def _close_drained(self, conn: socket.socket) -> None:
        self._draining.pop(conn, None)
        self.remove(conn)
        conn.close()

    def _run(self) -> None:
        while True:
            timeout = 1.0 if self._draining else None
            for key, _ in self._sel.select(timeout):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                elif isinstance(key.data, socket.socket):
                    self._drained(key.data)
                else:
                    try:
                        conn, addr = key.fileobj.accept()  # type: ignore[union-attr]
                    except OSError:  # closed meanwhile, or nothing after all
                        continue
                    if not key.data.group.accepted(conn, addr, key.data):
                        self._refuse(conn)
            now = time.monotonic()
            for conn in [c for c, until in self._draining.items() if until < now]:
                self._close_drained(conn)


_HUB: list[_Hub] = []
_HUB_LOCK = threading.Lock()


def _hub() -> _Hub:
    """The process's one hub, made with its first gateway (importing this module costs no
    socket or thread)."""
    with _HUB_LOCK:
        if not _HUB:
            _HUB.append(_Hub())
        return _HUB[0]


class Gateways:
    """One task's gateways: at most MAX_CONNECTIONS open connections over all of them, one
    HTTP client (made at the first request), all closed together when the task ends."""

    def __init__(self, platform_ports: set[int] | None = None, allow: Allow = frozenset()) -> None:
        self.platform_ports = platform_ports or set()
        self.allow = allow
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._lock = threading.Lock()
        self._listeners: list[socket.socket] = []
        self._open: set[socket.socket] = set()
        self._client: httpx.Client | None = None
        self._closed = False

    def add(self, sock: socket.socket, upstream: Upstream) -> str:
        """Serves `sock` (a listener, already bound inside the sandbox) as a gateway to
        `upstream`; its URL as the operator sees it."""
        port = int(sock.getsockname()[1])
        with self._lock:
            if self._closed:
                sock.close()
                raise RuntimeError("the task's gateways are closed")
            self._listeners.append(sock)
        _hub().add(sock, _Route(self, upstream))
        return f"http://127.0.0.1:{port}/"

    def client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(
                    verify=verified_tls(), timeout=httpx.Timeout(120.0, connect=10.0)
                )
            return self._client

    def accepted(self, conn: socket.socket, addr: Any, route: _Route) -> bool:
        """A connection the hub accepted: served on a thread of its own while the task is under
        its limit (False: the hub refuses it)."""
        if not self.slots.acquire(blocking=False):
            return False
        with self._lock:
            if self._closed:
                self.slots.release()
                conn.close()
                return True
            self._open.add(conn)
        threading.Thread(
            target=self._serve, args=(conn, addr, route), name="egress-conn", daemon=True
        ).start()
        return True

    def _serve(self, conn: socket.socket, addr: Any, route: _Route) -> None:
        try:
            conn.setblocking(True)
            _Handler(conn, addr, route)
        except (ConnectionError, TimeoutError):  # gone mid-reply, or stalled: its own doing
            pass
        except Exception:
            log.exception("egress gateway: a connection failed")
        finally:
            with self._lock:
                self._open.discard(conn)
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
            conn.close()
            self.slots.release()

    def close(self) -> None:
        """No more connections, and every open one cut (the task is over)."""
        with self._lock:
            self._closed = True
            listeners, self._listeners = self._listeners, []
            conns = list(self._open)
            client, self._client = self._client, None
        for sock in listeners:
            _hub().remove(sock)
            sock.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if client is not None:
            client.close()
