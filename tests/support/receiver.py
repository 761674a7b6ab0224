"""A real webhook receiver on 127.0.0.1 for delivery tests: it verifies every request with the
`standardwebhooks` package (a forged or missing signature answers 401 and is counted as
rejected), records what arrived, and can be told to answer otherwise (fail, Retry-After,
redirect). Tests wait on its arrivals, never on sleeps."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Arrival:
    webhook_id: str
    body: str
    verified: bool
    headers: dict[str, str]


@dataclass
class Receiver:
    port: int
    secret: str | None = None
    # status to answer (after verifying), with extra headers; None: 204
    answer: Callable[[Arrival], tuple[int, dict[str, str]]] | None = None
    arrivals: list[Arrival] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        recv = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n).decode()
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    assert recv.secret is not None
                    Webhook(recv.secret).verify(body, headers)
                    ok = True
                except (WebhookVerificationError, AssertionError):
                    ok = False
                a = Arrival(headers.get("webhook-id", ""), body, ok, headers)
                code, extra = (204, {}) if ok else (401, {})
                if ok and recv.answer is not None:
                    code, extra = recv.answer(a)
                with recv._cond:  # recorded before answering: the sender sees it done
                    recv.arrivals.append(a)
                    recv._cond.notify_all()
                self.send_response(code)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def wait(self, check: Callable[[list[Arrival]], bool], timeout: float = 20.0) -> list[Arrival]:
        with self._cond:
            if not self._cond.wait_for(lambda: check(self.arrivals), timeout):
                raise AssertionError(f"receiver: not seen within {timeout}s: {len(self.arrivals)}")
            return list(self.arrivals)
