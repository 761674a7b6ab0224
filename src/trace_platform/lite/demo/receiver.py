"""The demo's webhook receiver on 127.0.0.1: it verifies every request with the
`standardwebhooks` package, as any receiver of Trace's webhooks would, answers 401 to a
forged one, and records what arrived (the demo counts each verified idempotency key once).
The delivery tests use it too (tests/support/receiver.py): it can be told to answer otherwise
(fail, Retry-After, redirect), and `wait` blocks on arrivals, never on sleeps."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from trace_platform.db.embedded import free_port

MAX_BODY = 1 << 20  # bytes: a request's body longer is answered 413, unread
IDLE_SECONDS = 10.0  # a connection silent this long is closed (its thread freed)


@dataclass
class Arrival:
    webhook_id: str
    body: str
    verified: bool
    headers: dict[str, str]


class ReceiverServer(ThreadingHTTPServer):
    """The receiver's HTTP server: a thread per connection, at most `max_connections` of them
    (the next waits in the listen backlog until one ends), and a backlog for bursts."""

    daemon_threads = True
    # Connections waiting to be accepted. socketserver's 5 overflowed under a burst of sends
    # (two Delivery Services, 8 at a time each): the dropped ones waited 1 s for a SYN retry.
    request_queue_size = 128
    max_connections = 64

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.max_connections)
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()  # accepting waits for a free slot: the backlog holds the rest
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


# What to answer a verified request: (status, extra headers). None: 204.
Answer = Callable[[Arrival], tuple[int, dict[str, str]]]


class DemoReceiver:
    def __init__(
        self,
        secret: str | None = None,
        port: int | None = None,
        *,
        path: str = "/alerts",
        answer: Answer | None = None,
    ) -> None:
        self.secret = secret
        self.port = port or free_port()
        self.path = path
        self.answer = answer
        self.arrivals: list[Arrival] = []
        self._cond = threading.Condition()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    @property
    def received(self) -> int:
        return len(self.arrivals)

    @property
    def rejected(self) -> int:
        return sum(not a.verified for a in self.arrivals)

    @property
    def verified(self) -> dict[str, str]:
        """webhook-id -> body, of every request that verified."""
        return {a.webhook_id: a.body for a in self.arrivals if a.verified}

    def start(self) -> DemoReceiver:
        recv = self

        class Handler(BaseHTTPRequestHandler):
            timeout = IDLE_SECONDS

            def do_POST(self) -> None:
                length = (self.headers.get("content-length") or "0").strip()
                if not (length.isascii() and length.isdigit()):  # "-1": read to the end
                    self.send_error(400, "a Content-Length of digits")
                    return
                n = int(length) if len(length) <= 12 else MAX_BODY + 1
                headers = {k.lower(): v for k, v in self.headers.items()}
                if n > MAX_BODY:  # refused unread, recorded as not verified
                    code, extra = recv._refused(headers), {"connection": "close"}
                    self.close_connection = True
                else:
                    body = self.rfile.read(n).decode("utf-8", "replace")
                    code, extra = recv._arrived(body, headers)
                self.send_response(code)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        server = self._server = ReceiverServer(("127.0.0.1", self.port), Handler)
        # `stop` waits for the loop to look again: every 0.05 s, not socketserver's 0.5 s.
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def _arrived(self, body: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        """Verifies and records a request (before answering: the sender sees it done)."""
        try:
            if self.secret is None:
                raise WebhookVerificationError("no secret yet")
            Webhook(self.secret).verify(body, headers)
            ok = True
        except WebhookVerificationError:
            ok = False
        a = Arrival(headers.get("webhook-id", ""), body, ok, headers)
        code, extra = (204, {}) if ok else (401, {})
        if ok and self.answer is not None:
            code, extra = self.answer(a)
        self._record(a)
        return code, extra

    def _refused(self, headers: dict[str, str]) -> int:
        """A request whose body is too long to read: recorded as not verified."""
        self._record(Arrival(headers.get("webhook-id", ""), "", False, headers))
        return 413

    def _record(self, a: Arrival) -> None:
        with self._cond:
            self.arrivals.append(a)
            self._cond.notify_all()

    def wait(self, check: Callable[[list[Arrival]], bool], timeout: float = 20.0) -> list[Arrival]:
        """The arrivals once `check` holds of them (AssertionError after `timeout`)."""
        with self._cond:
            if not self._cond.wait_for(lambda: check(self.arrivals), timeout):
                raise AssertionError(f"receiver: not seen within {timeout}s: {len(self.arrivals)}")
            return list(self.arrivals)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
