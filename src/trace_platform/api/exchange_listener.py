"""The workers' exchange (`POST /internal/exchange`: their completions and next claims) on a
blocking HTTP/1.1 listener of its own, beside the API's event loop.

Why: every task passes through an exchange, and on the API's event loop each one paid for
uvicorn, the middlewares, FastAPI's routing and dependency solving, and two hand-offs between
the loop and a threadpool thread (waking a thread costs tens of microseconds on this VM).
Here one thread per worker connection reads the request, runs the Dispatcher and writes the
answer: measured on 2 cores at 2 workers x 8 wrappers, about a quarter less API CPU per task.

It answers exactly what the API's route answers, through the same code: the internal token
(checked before the body is read, in constant time), a body of at most MAX_BODY_BYTES with a
Content-Length (no chunked bodies: 411), the gateway's bounded JSON parse, no NUL in a header,
ExchangeBody's validation, `exchange_answer` and Trace's error shapes (`known_error`).
Anything else (another path or method) is refused in that shape.

Anyone who can reach the port can connect, so what a caller without the token may hold is
bounded apart from the workers' share: a request's line and headers are at most
MAX_HEADER_BYTES and must be in HEADER_SECONDS (from the connect, for a new connection), a
caller without the token is refused as soon as its headers are in (its body never read), and
at most MAX_UNAUTHENTICATED connections wait for their first headers: one more ends the one
waiting longest, so half-sent requests cannot fill the listener. A connection whose headers
carry the token takes one of MAX_CONNECTIONS places (over them: 503), keeps it while alive,
and is closed after IDLE_SECONDS without a request; its body must arrive at
BODY_BYTES_PER_SECOND (after BODY_SECONDS of grace), the whole request within REQUEST_SECONDS.

HTTPS with the API's certificate when it has one (TRACE_API_TLS_CERT, docs/tls.md); else plain
HTTP, for workers on the same host or a private network: the token travels in it, as it does
to an `http://` API. A worker falls back to the API's route whenever this listener
cannot be reached, so it is an optimisation, never a dependency."""

from __future__ import annotations

import contextlib
import email.message
import functools
import http.client
import json
import logging
import secrets
import socket
import socketserver
import ssl
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from trace_platform.api.errors import error_response, http_error_response, known_error
from trace_platform.api.gateway import MAX_BODY_BYTES, nul_header, parse_json
from trace_platform.api.routes.internal import exchange_answer
from trace_platform.contract import LEASE_TOKENS_HEADER, ExchangeBody
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.threaded_server import ThreadedServer

log = logging.getLogger("trace_platform.api.exchange")

PATH = "/internal/exchange"
MAX_CONNECTIONS = 256  # connections past the token, one thread each; a worker keeps about one
MAX_UNAUTHENTICATED = 64  # connections not yet past the token; one more ends the oldest
MAX_HEADER_BYTES = 32 * 1024  # request line and headers (100 lease tokens are ~3.7 KB)
IDLE_SECONDS = 75.0  # a keep-alive connection with no request in this long is closed
HEADER_SECONDS = 5.0  # a request's line and headers, from its first byte (a new connection's:
# from the connect); a worker sends them in one write
BODY_SECONDS = 5.0  # a body's grace, then it must keep up BODY_BYTES_PER_SECOND
BODY_BYTES_PER_SECOND = 256 * 1024
REQUEST_SECONDS = 30.0  # from a request's first byte to the last of its body, at most
STOP_SECONDS = 5.0  # what `stop` gives the requests being answered to finish
_CHUNK = 256 * 1024
_MAX_LENGTH_DIGITS = 9  # a longer Content-Length is over any limit (and int() refuses 4,300+)


class _Refused(Exception):
    """A refusal that ends the connection (its body, if any, was not read)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _HeadersTooLarge(http.client.HTTPException):
    """A request's line and headers went past MAX_HEADER_BYTES."""


class _HeaderBudget:
    """The connection's reader while a request's line and headers arrive: MAX_HEADER_BYTES
    in all (the base class bounds each line and their number, not their sum: 6.5 MB)."""

    def __init__(self, raw: Any, budget: int) -> None:
        self.raw, self.left = raw, budget

    def readline(self, limit: int = -1) -> bytes:
        want = self.left + 1 if limit < 0 else min(limit, self.left + 1)
        line: bytes = self.raw.readline(want)
        self.left -= len(line)
        if self.left < 0:
            raise _HeadersTooLarge(f"request headers over {MAX_HEADER_BYTES} bytes")
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "trace"
    sys_version = ""
    timeout = IDLE_SECONDS  # the socket's: the wait for a request, and for each read within it
    authenticated = False  # a request of this connection carried the token
    disable_nagle_algorithm = True  # each answer is one write; Nagle would hold it 40 ms
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.raw_rfile = self.rfile

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def handle_one_request(self) -> None:
        """One request, once its first byte is in: its line and headers within HEADER_SECONDS
        (a new connection's from its connect), the whole of it and its answer within
        REQUEST_SECONDS, or the server's watchdog ends the connection (a client dripping its
        headers holds no thread for longer)."""
        try:
            if self.authenticated:
                self.connection.settimeout(IDLE_SECONDS)
            else:  # a new connection: its first headers are due HEADER_SECONDS after connect
                left = self.server.headers_due(self.connection) - time.monotonic()
                self.connection.settimeout(max(0.001, left))
            if not self.rfile.peek(1):  # the client closed the connection
                self.close_connection = True
                return
        except OSError:  # idle too long, or reset
            self.close_connection = True
            return
        self.began = time.monotonic()
        due = self.began + HEADER_SECONDS
        if not self.authenticated:
            due = min(due, self.server.headers_due(self.connection))
        if not self.server.busy(self.connection, due):
            self.close_connection = True  # the listener is stopping: ended, nothing done
            return
        self.rfile = _HeaderBudget(self.raw_rfile, MAX_HEADER_BYTES)
        try:
            self.connection.settimeout(max(0.001, due - time.monotonic()))
            super().handle_one_request()
        except _HeadersTooLarge:  # in the request line (the base class takes the headers')
            self.command, self.path = "", ""
            self.send_error(431)
        finally:
            self.rfile = self.raw_rfile
            self.server.idle(self.connection)

    def parse_request(self) -> bool:
        """The base class's parse, and headers it read whole: a malformed header line (which
        it would skip, with every line after it) ends the request, as uvicorn's 400 does. With
        the headers in, the token decides at once whether this connection is a worker's."""
        try:
            if not super().parse_request():
                return False
        finally:
            self.rfile = self.raw_rfile  # the body is read from the connection itself
        if self.headers.defects or self.headers.get_payload():
            self.send_error(400, "malformed request headers")
            return False
        if self._authorized() and not self.authenticated:
            if not self.server.authenticate(self.connection):
                self.close_connection = True
                full = "the exchange listener serves as many workers as it can; use the API"
                self._send(error_response(503, "unavailable", full).body, 503, close=True)
                return False
            self.authenticated = True
        # A second past the request's own timeouts: a late body is answered 408 first. (A
        # caller without the token is answered now, whatever it asked: it sends no body.)
        self.server.due(self.connection, self.began + REQUEST_SECONDS + 1.0)
        return True

    def handle_expect_100(self) -> bool:
        """`Expect: 100-continue` invites the body: only with the token."""
        if not self._authorized():
            self.send_error(401, "internal endpoints need the platform's internal token")
            return False
        return bool(super().handle_expect_100())

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The base class's own refusals (a malformed request line, headers over its limits,
        an unsupported method) in Trace's shape; the connection ends."""
        self.close_connection = True
        method, path = getattr(self, "command", None) or "?", getattr(self, "path", "")
        if isinstance(self.rfile, _HeaderBudget) and self.rfile.left < 0:  # not "too many"
            code, message = 431, f"request line and headers over {MAX_HEADER_BYTES} bytes"
        refusal = http_error_response(code, message, method, path)
        self._send(refusal.body, code, close=True)

    def do_POST(self) -> None:
        self.body_read = False
        try:
            answer = self._exchange()
        except _Refused as e:
            self.close_connection = True
            self._send(error_response(e.status, e.code, e.message).body, e.status, close=True)
            return
        except Exception as e:  # every error is answered, as LastResort does
            refusal = known_error(e, "POST", self.path)
            if refusal is None:
                refusal = _internal_error(self.path)
            # A body not read whole would be read as the next request: the connection ends.
            self.close_connection = self.close_connection or not self.body_read
            self._send(refusal.body, refusal.status_code)
            return
        self.server.answered += 1  # not atomic: a count to see it used, not an audit
        self._send(answer, 200)

    def _not_here(self) -> None:
        """Any other method: refused unread (401 without the token, as on the API)."""
        if not self._authorized():
            self.send_error(401, "internal endpoints need the platform's internal token")
            return
        self.send_error(404 if self.path != PATH else 405)

    do_GET = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _not_here

    def _authorized(self) -> bool:
        """The internal token, compared in constant time (the first such header, as the
        API's InternalToken middleware takes it)."""
        given = self.headers.get("X-Internal-Token")
        if given is None:
            return False
        try:
            raw = given.encode("latin-1")  # as the headers were read
        except UnicodeEncodeError:
            return False
        return secrets.compare_digest(raw, self.server.token)

    def _exchange(self) -> bytes:
        # The token before anything else, as on the API: without it, every path is a 401.
        if not self._authorized():
            raise _Refused(
                401, "unauthorized", "internal endpoints need the platform's internal token"
            )
        if not self.server.answering(self.connection):  # stop's grace is for workers' calls
            raise _Refused(503, "unavailable", "the exchange listener is stopping")
        if self.path != PATH:
            raise _Refused(404, "not_found", f"no endpoint POST {self.path[:200]} here")
        body = self._body()
        for key, value in self.headers.items():
            if "\x00" in value:
                raise nul_header(key)
        if not body:  # as FastAPI answers a required body that is missing
            missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
            raise RequestValidationError([missing])
        if not _json_type(self.headers.get("Content-Type")):
            parsed: Any = body  # as FastAPI takes it: bytes, which no model accepts
        else:
            parsed = self._parsed(body)
        try:
            # from_attributes: as FastAPI validates a body (the same messages)
            exchange = ExchangeBody.model_validate(parsed, from_attributes=True)
        except ValidationError as e:  # located as FastAPI locates a body's problems
            raise RequestValidationError(
                [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]
            ) from None
        tokens = self.headers.get(LEASE_TOKENS_HEADER)
        return exchange_answer(self.server.dispatcher, exchange, tokens)

    @staticmethod
    def _parsed(body: bytes) -> Any:
        try:
            return parse_json(body)
        except json.JSONDecodeError as e:  # as FastAPI reports a body that is not JSON
            raise RequestValidationError(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body", e.pos),
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": e.msg},
                    }
                ]
            ) from None

    def _body(self) -> bytes:
        if "Transfer-Encoding" in self.headers:
            raise _Refused(411, "length_required", "send the body with a Content-Length")
        lengths = self.headers.get_all("Content-Length") or []
        if len(lengths) != 1:
            raise _Refused(411, "length_required", "send the body with one Content-Length")
        length = lengths[0].strip()
        if not length.isascii() or not length.isdigit():
            raise _Refused(400, "bad_request", "Content-Length is not a number")
        size = int(length) if len(length) <= _MAX_LENGTH_DIGITS else MAX_BODY_BYTES + 1
        if size > MAX_BODY_BYTES:
            raise _Refused(
                413, "too_large", f"request body is {size} bytes; the limit is {MAX_BODY_BYTES}"
            )
        parts: list[bytes] = []
        left = size
        # A sender slower than BODY_BYTES_PER_SECOND (past BODY_SECONDS) holds its thread no
        # longer: the body is due then, and the request's own time is the bound above that.
        due = min(
            self.began + REQUEST_SECONDS,
            time.monotonic() + BODY_SECONDS + size / BODY_BYTES_PER_SECOND,
        )
        self.server.due(self.connection, due + 1.0)  # the watchdog's: the 408 goes out first
        try:
            while left:
                # Each read waits no longer than what is left of the body's time.
                wait = due - time.monotonic()
                if wait <= 0:
                    raise TimeoutError
                self.connection.settimeout(wait)
                chunk = self.rfile.read1(min(left, _CHUNK))
                if not chunk:
                    raise _Refused(400, "bad_request", "the body ended before its Content-Length")
                parts.append(chunk)
                left -= len(chunk)
        except TimeoutError:
            raise _Refused(
                408, "timeout", f"the body ({size} bytes) did not arrive in time"
            ) from None
        except OSError:  # the client reset the connection: nothing to answer, quietly
            raise _Refused(400, "bad_request", "the connection ended mid-body") from None
        # The answer's time: what is left of the request's.
        self.server.due(self.connection, self.began + REQUEST_SECONDS + 1.0)
        self.body_read = True
        return b"".join(parts)

    def _send(self, body: bytes, status: int, close: bool = False) -> None:
        head = (
            f"HTTP/1.1 {status} {_phrase(status)}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            + ("Connection: close\r\n" if close or self.close_connection else "")
            + "\r\n"
        )
        if self.command == "HEAD":
            body = b""
        try:
            self.wfile.write(head.encode("latin-1") + body)  # one write: one segment
        except OSError:  # the worker went away; it retries elsewhere
            self.close_connection = True


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


@functools.lru_cache(maxsize=64)  # workers send one; a hostile caller cannot grow it
def _json_type(content_type: str | None) -> bool:
    """A JSON media type, as FastAPI decides it (no Content-Type: not JSON, strictly)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _internal_error(path: str) -> Any:
    """A 500 in Trace's shape, its traceback logged under a fresh id (as LastResort does)."""
    error_id = uuid.uuid4().hex
    log.exception("unhandled error %s on POST %s", error_id, path[:200])
    return error_response(
        500, "internal", f"internal error (logged as {error_id})", {"error_id": error_id}
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        dispatcher: Dispatcher,
        token: str,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.tls = tls
        self.token = token.encode()
        self.answered = 0  # exchanges answered 200
        # Every connection being served, and for one with a request in (or a new one), its
        # deadline; those whose request is past the token (stop waits for their answers, and
        # no other's).
        self._open: dict[socket.socket, float | None] = {}
        self._answering: set[socket.socket] = set()
        # Connections no request with the token came on yet, oldest first, with when their
        # first headers are due; and those one did (MAX_CONNECTIONS of them at most).
        self._pending: dict[socket.socket, float] = {}
        self._workers: set[socket.socket] = set()
        self._lock = threading.Condition()
        self._stopping = False
        self._stopped = threading.Event()  # the watchdog's end
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)
        self._watchdog = threading.Thread(
            target=self._watch, name="exchange-listener-watchdog", daemon=True
        )
        self._watchdog.start()

    def server_bind(self) -> None:
        # HTTPServer's also looks the host's name up (getfqdn): a DNS wait for nothing here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        if self.tls is not None:
            # The handshake is made by the connection's own thread, at its first read, within
            # its first headers' time: a client that never finishes it holds up no other.
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that reset mid-request: nothing to print a traceback about.
        log.debug("connection from %s ended in error", client_address, exc_info=True)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:  # registered before its thread runs: `stop` sees it
            if self._stopping:
                self.shutdown_request(request)
                return
            if len(self._pending) >= MAX_UNAUTHENTICATED:
                # The one waiting longest goes (its thread sees its connection end): a worker
                # sends its headers at once, so only a slow or silent caller is ever ended.
                oldest = next(iter(self._pending))
                del self._pending[oldest]
                _end(oldest)
            due = time.monotonic() + HEADER_SECONDS
            self._pending[request] = due
            self._open[request] = due
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        with self._lock:
            self._answering.discard(request)
            self._pending.pop(request, None)
            self._workers.discard(request)
            self._open.pop(request, None)
            if self._stopping:
                self._lock.notify_all()

    def headers_due(self, conn: socket.socket) -> float:
        """When a new connection's first headers are due (0.0, long past: it was ended)."""
        with self._lock:
            return self._pending.get(conn, 0.0)

    def authenticate(self, conn: socket.socket) -> bool:
        """`conn`'s request carries the token: it takes a worker's place, if one is free."""
        with self._lock:
            if conn in self._workers:
                return True
            if conn not in self._pending or len(self._workers) >= MAX_CONNECTIONS:
                return False  # ended meanwhile, or every place is taken
            del self._pending[conn]
            self._workers.add(conn)
            return True

    def due(self, conn: socket.socket, deadline: float) -> None:
        """`conn`'s request is to be done by `deadline` now (its headers are in, or its body)."""
        with self._lock:
            if conn in self._open:
                self._open[conn] = deadline

    def busy(self, conn: socket.socket, deadline: float) -> bool:
        """A request is in on `conn`, to be answered by `deadline`; False: the listener is
        stopping (or ended `conn`), and nothing is to be done for it."""
        with self._lock:
            if self._stopping or conn not in self._open:
                return False
            self._open[conn] = deadline
            return True

    def answering(self, conn: socket.socket) -> bool:
        """`conn`'s request passed the token: `stop` lets its answer go out. False: too late."""
        with self._lock:
            if self._stopping:
                return False
            self._answering.add(conn)
            return True

    def idle(self, conn: socket.socket) -> None:
        with self._lock:
            if conn in self._open:
                self._open[conn] = None
            self._answering.discard(conn)
            if self._stopping:  # between requests: this one ends now
                _end(conn)
                self._lock.notify_all()

    def _watch(self) -> None:
        """Ends each connection whose request is not answered by its deadline (woken by
        time alone: a request never wakes it)."""
        while not self._stopped.wait(0.5):
            with self._lock:
                now = time.monotonic()
                for conn, deadline in self._open.items():
                    if deadline is not None and now > deadline:
                        _end(conn)

    def close_connections(self) -> None:
        """A request past the token gets STOP_SECONDS to be answered, then its connection
        ends too; every other connection (idle, or its request still arriving) ends now."""
        with self._lock:
            self._stopping = True
            for conn in self._open:
                if conn not in self._answering:
                    _end(conn)
            end = time.monotonic() + STOP_SECONDS
            while self._answering:
                if not self._lock.wait(max(0.0, end - time.monotonic())):
                    break
            for conn in self._open:
                _end(conn)
        self._stopped.set()


def _end(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        # The socket's own shutdown, also under TLS: SSLSocket.shutdown would drop its TLS
        # state under the thread that may be reading it.
        socket.socket.shutdown(conn, socket.SHUT_RDWR)


class ExchangeListener(ThreadedServer[_Server]):
    """`POST /internal/exchange` on `host:port` (port 0: any free one), served until `stop`."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        token: str,
        host: str,
        port: int,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """`tls`: served over TLS with it (trace_platform.tls.server_context), else plain."""
        if not token:
            raise RuntimeError("the exchange listener needs the internal token")
        super().__init__(_Server((host, port), dispatcher, token, tls), "exchange-listener")

    def closed(self) -> None:
        self.server.close_connections()
