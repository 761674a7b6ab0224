"""The worker's HTTP transport to the internal API (`worker/http.py`), against a real loopback
server: what it sends, how failures come back, and that a worker's wrappers fit its pool."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from trace_platform.contract import HeartbeatResponse
from trace_platform.worker.client import ApiError, DispatcherClient, transient
from trace_platform.worker.http import Transport, TransportError, pool_size

seen: list[dict[str, Any]] = []


class _Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if self.path.startswith("/api/slow"):
            time.sleep(0.2)
        if self.path.startswith("/api/broken"):
            self._reply(503, b"upstream restarting")
        else:
            self._reply(200, b'{"ok": true}')

    do_GET = do_POST

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    seen.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}/api"
    server.shutdown()
    server.server_close()


def test_requests_go_out_as_given(api: str) -> None:
    t = Transport(api, {"X-Internal-Token": "t"}, 5.0, pool_size(1))
    r = t.request(
        "POST",
        "/internal/heartbeat",
        content='{"a": 1}',
        params={"task_id": "x y", "attempt": 2},
        headers={"X-Lease-Token": "l"},
    )
    assert (r.status, r.content) == (200, b'{"ok": true}')
    (got,) = seen
    assert got["path"] == "/api/internal/heartbeat?task_id=x+y&attempt=2"
    assert got["headers"]["X-Internal-Token"] == "t" and got["headers"]["X-Lease-Token"] == "l"
    assert got["body"] == b'{"a": 1}'
    t.close()


def test_failures_come_back_as_what_they_are(api: str) -> None:
    client = DispatcherClient(api, internal_token="t", retries=0)
    with pytest.raises(ApiError) as refused:  # an answer, though not JSON
        client._call("POST", "/broken", dict, content="{}")  # type: ignore[type-var]
    assert refused.value.status == 503 and "restarting" in refused.value.message
    assert transient(refused.value)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TransportError) as unreachable:
        Transport(f"http://127.0.0.1:{port}", {}, 1.0, 1).request("GET", "/x")
    assert transient(unreachable.value)
    with pytest.raises(TransportError):  # a per-call timeout
        Transport(api, {}, 5.0, 1).request("GET", "/slow", timeout=0.05)
    for url in ("http://user:hunter2@127.0.0.1:1/", "http://:hunter2@127.0.0.1:1/"):
        with pytest.raises(ValueError, match="no credentials") as refused:
            Transport(url, {}, 1.0, 1)
        assert "hunter2" not in str(refused.value)  # nor echoed


def test_a_workers_wrappers_fit_its_pool(api: str, caplog: pytest.LogCaptureFixture) -> None:
    """Every wrapper of a worker with a heartbeat and a completion in flight at once: each
    gets a kept connection (urllib3 warns when it must open one past its pool)."""
    wrappers = 6
    t = Transport(api, {}, 5.0, pool_size(wrappers))
    calls = [threading.Thread(target=t.request, args=("GET", "/slow")) for _ in range(2 * wrappers)]
    with caplog.at_level(logging.WARNING, logger="urllib3"):
        for c in calls:
            c.start()
        for c in calls:
            c.join(10)
    assert len(seen) == 2 * wrappers
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]
    t.close()


def test_a_request_that_got_no_answer_is_logged_before_it_is_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A transport failure (a refused connection here; a 30 s read timeout in the field) is
    retried, and said in the worker's log, so a slow stall is not silent."""
    client = DispatcherClient("http://127.0.0.1:9", retries=1)  # port 9: nothing listens
    with (
        caplog.at_level(logging.WARNING, logger="trace_platform.worker.client"),
        pytest.raises(TransportError),
    ):
        client._call("POST", "/internal/heartbeat", HeartbeatResponse)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "try 2 of 2" in said[0] and "giving up" in said[1], said
    assert all(m.startswith("POST /internal/heartbeat: no answer after") for m in said), said
