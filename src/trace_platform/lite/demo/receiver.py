"""The demo's webhook receiver on 127.0.0.1: it verifies every request with the
`standardwebhooks` package, as any receiver of Trace's webhooks would, answers 401 to a
forged one, and counts what arrived and verified (each idempotency key once)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from trace_platform.db.embedded import free_port


class DemoReceiver:
    def __init__(self, secret: str | None = None, port: int | None = None) -> None:
        self.secret = secret
        self.port = port or free_port()
        self.verified: dict[str, str] = {}  # webhook-id -> body
        self.rejected = 0
        self.received = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"

    def start(self) -> DemoReceiver:
        recv = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = min(int(self.headers.get("content-length") or 0), 1 << 20)
                body = self.rfile.read(n).decode("utf-8", "replace")
                headers = {k.lower(): v for k, v in self.headers.items()}
                ok = recv._verify(body, headers)
                self.send_response(204 if ok else 401)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def _verify(self, body: str, headers: dict[str, str]) -> bool:
        try:
            if self.secret is None:
                raise WebhookVerificationError("no secret yet")
            Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError:
            with self._lock:
                self.received += 1
                self.rejected += 1
            return False
        with self._lock:
            self.received += 1
            self.verified[headers["webhook-id"]] = body
        return True

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
