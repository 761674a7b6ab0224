"""The workers' exchange listener (api/exchange_listener.py) over real sockets: every refusal
the API's route gives, given alike; what only a hand-written HTTP server can get wrong
(the token before the body, Content-Length, slow and idle connections, the connection cap);
and the worker's client, which uses it for every claim and batched completion while it can
reach it and the API's routes otherwise. (tests/integration/test_exchange.py runs each of its
exchange tests against both the route and the listener.)"""

from __future__ import annotations

import contextlib
import json
import logging
import selectors
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.integration.test_batches import claim_batch, new_tasks
from tests.integration.test_exchange import rows
from trace_platform.api import exchange_listener as el
from trace_platform.api.exchange_listener import ExchangeListener
from trace_platform.api.gateway import MAX_BODY_BYTES
from trace_platform.db.embedded import free_port
from trace_platform.errors import NotFound
from trace_platform.lite.stack import ApiServer
from trace_platform.services import Services
from trace_platform.worker.client import DispatcherClient
from trace_platform.worker.http import Response


def _listen(services: Services, port: int = 0) -> ExchangeListener:
    """A listener serving `services` (with this module's settings as they are now)."""
    got = ExchangeListener(services.dispatcher, services.internal_token or "", "127.0.0.1", port)
    return got.start()


@pytest.fixture
def listener(services: Services) -> Iterator[ExchangeListener]:
    got = _listen(services)
    yield got
    got.stop()


def _raw(
    port: int, request: bytes, *, read_timeout: float = 5.0
) -> tuple[int, dict[str, Any], bytes]:
    """One request on a fresh connection: (status, JSON answer, what followed it). `what
    followed` is b"" when the server closed the connection after its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed without an answer: {data!r}"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(
            next(
                ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")
            ).split(b":")[1]
        )
        while len(rest) < length:
            rest += sock.recv(65536)
        body, tail = rest[:length], rest[length:]
        if b"connection: close" in head.lower():
            sock.settimeout(2)
            tail += sock.recv(65536)  # b"": closed
        return status, json.loads(body), tail


def _post(
    token: str | None,
    body: bytes,
    path: str = "/internal/exchange",
    extra: str = "",
    media: str | None = "application/json",
) -> bytes:
    auth = f"X-Internal-Token: {token}\r\n" if token is not None else ""
    kind = f"Content-Type: {media}\r\n" if media else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}{kind}Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


BODIES = {
    "not JSON": b"not json",
    "cut short": b'{"claims": [',
    "nested too deep": b"[" * 100 + b"]" * 100,
    "NaN": b'{"claims": NaN}',
    "a number out of range": b'{"claims": [], "completions": 1e999}',
    "a NUL": b'{"claims": [{"task_id": "\\u0000", "worker_id": "w"}]}',
    "a lone surrogate": b'{"claims": [{"task_id": "\\ud800", "worker_id": "w"}]}',
    "wrong types": b'{"claims": [{"task_id": 5, "worker_id": []}]}',
    "an unknown field": b'{"claims": [], "completions": [], "more": 1}',
    "a list": b"[]",
    "empty": b"{}",
    "not UTF-8": b'{"claims": "\xff"}',
    "nothing": b"",
}
JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("case", sorted(BODIES))
def test_each_bad_body_is_refused_as_the_route_refuses_it(
    api: httpx.Client, listener: ExchangeListener, case: str
) -> None:
    token = api.headers["X-Internal-Token"]
    for media in ("application/json", "application/merge-patch+json", None, "text/plain"):
        headers = {"Content-Type": media} if media else {}
        route = api.post("/internal/exchange", content=BODIES[case], headers=headers)
        status, answer, _ = _raw(listener.port, _post(token, BODIES[case], media=media))
        assert route.status_code == 422, route.text
        assert (status, answer) == (route.status_code, route.json()), media


def test_the_lease_tokens_are_checked_as_the_route_checks_them(
    api: httpx.Client, listener: ExchangeListener, services: Services
) -> None:
    (c,) = [r["claim"] for r in claim_batch(api, new_tasks(services, 1))]
    body = json.dumps(
        {"completions": [{"task_id": c["task_id"], "attempt": 1, "outcome": "succeeded"}]}
    ).encode()
    for header in ("", "X-Lease-Tokens: nope\r\n", f"X-Lease-Tokens: {c['lease_token']},x\r\n"):
        status, answer, _ = _raw(
            listener.port, _post(api.headers["X-Internal-Token"], body, extra=header)
        )
        headers = dict(h.split(": ", 1) for h in header.strip().split("\r\n") if h)
        route = api.post("/internal/exchange", content=body, headers={**JSON, **headers})
        assert (status, answer) == (route.status_code, route.json()) and status == 422
        assert c["lease_token"] not in json.dumps(answer)
    assert rows(services, [c["task_id"]])[c["task_id"]]["status"] == "running"


@pytest.mark.parametrize("token", [None, "guess", "", "é"])
def test_without_the_token_nothing_is_read_or_done(
    listener: ExchangeListener, services: Services, token: str | None
) -> None:
    """401 before the body is read (the connection ends), on any path and method."""
    (fresh,) = new_tasks(services, 1)
    body = json.dumps({"claims": [{"task_id": fresh, "worker_id": "x"}]}).encode()
    head = _post(token, body)[: -len(body)]  # the headers only: the body is never needed
    status, answer, tail = _raw(listener.port, head)
    assert status == 401 and answer["error"] == "unauthorized" and tail == b""
    for request in (_post(token, b"{}", path="/internal/claim"), b"GET / HTTP/1.1\r\n\r\n"):
        status, answer, _ = _raw(listener.port, request)
        assert status == 401 and answer["error"] == "unauthorized"
    assert rows(services, [fresh])[fresh]["status"] == "queued"


def test_what_it_does_not_serve_is_refused_in_traces_shape(
    listener: ExchangeListener, services: Services
) -> None:
    token = services.internal_token or ""
    cases = {
        _post(token, b"{}", path="/internal/claim"): 404,
        _post(token, b"{}", path="/internal/exchange?x=1"): 404,
        f"GET /internal/exchange HTTP/1.1\r\nX-Internal-Token: {token}\r\n\r\n".encode(): 405,
        b"BREW /internal/exchange HTTP/1.1\r\n\r\n": 501,
        b"garbage\r\n\r\n": 400,
    }
    for request, expected in cases.items():
        status, answer, tail = _raw(listener.port, request)
        assert status == expected, (request, answer)
        assert set(answer) == {"error", "message", "detail"} and tail == b""


def test_a_body_must_have_one_content_length_within_the_limit(
    listener: ExchangeListener, services: Services
) -> None:
    token = services.internal_token or ""
    auth = f"POST /internal/exchange HTTP/1.1\r\nX-Internal-Token: {token}\r\n"
    chunked = (auth + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n").encode()
    assert _raw(listener.port, chunked)[:2][0] == 411
    assert _raw(listener.port, (auth + "\r\n").encode())[0] == 411
    two = (auth + "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}").encode()
    assert _raw(listener.port, two)[0] == 411
    assert _raw(listener.port, (auth + "Content-Length: -1\r\n\r\n").encode())[0] == 400
    # Over the limit: answered from the headers alone (no byte of the body is sent here).
    over = (auth + f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n").encode()
    status, answer, tail = _raw(listener.port, over)
    assert status == 413 and answer["error"] == "too_large" and tail == b""


def test_a_nul_in_a_header_is_refused(listener: ExchangeListener, services: Services) -> None:
    (fresh,) = new_tasks(services, 1)
    body = json.dumps({"claims": [{"task_id": fresh, "worker_id": "x"}]}).encode()
    status, answer, _ = _raw(
        listener.port, _post(services.internal_token, body, extra="X-Other: a\x00b\r\n")
    )
    assert status == 422 and "NUL" in answer["message"]
    assert rows(services, [fresh])[fresh]["status"] == "queued"


def test_a_body_that_does_not_arrive_in_time_ends_the_connection(
    listener: ExchangeListener, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(el, "REQUEST_SECONDS", 0.5)
    (fresh,) = new_tasks(services, 1)
    body = json.dumps({"claims": [{"task_id": fresh, "worker_id": "x"}]}).encode()
    began = time.monotonic()
    status, _, tail = _raw(listener.port, _post(services.internal_token, body)[:-5])
    assert status == 408 and tail == b"" and time.monotonic() - began < 5
    assert rows(services, [fresh])[fresh]["status"] == "queued"


def test_a_connection_serves_one_request_after_another(
    listener: ExchangeListener, services: Services
) -> None:
    ids = new_tasks(services, 2)
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as sock:
        reader = sock.makefile("rb")
        for t in ids:
            body = json.dumps({"claims": [{"task_id": t, "worker_id": "x"}]}).encode()
            sock.sendall(_post(services.internal_token, body))
            assert reader.readline().startswith(b"HTTP/1.1 200")
            length = 0
            while (line := reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length"):
                    length = int(line.split(b":")[1])
            assert json.loads(reader.read(length))["claims"][0]["claim"]["attempt"] == 1
    assert listener.server.answered == 2


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """The status and body of one answer on `sock` (kept open)."""
    reader = sock.makefile("rb")
    status = int(reader.readline().split(b" ", 2)[1])
    length = 0
    while (line := reader.readline()) != b"\r\n":
        if line.lower().startswith(b"content-length"):
            length = int(line.split(b":")[1])
    return status, reader.read(length)


def test_workers_over_the_cap_are_refused_and_stop_ends_idle_ones(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MAX_CONNECTIONS bounds the connections past the token: one more is answered 503."""
    monkeypatch.setattr(el, "MAX_CONNECTIONS", 2)
    listener = _listen(services)
    held = [socket.create_connection(("127.0.0.1", listener.port), timeout=5) for _ in range(2)]
    try:
        for sock in held:  # each a worker's now (a 422 keeps the connection)
            sock.sendall(_post(services.internal_token, b"{}"))
            assert _answer(sock)[0] == 422
        status, answer, tail = _raw(listener.port, _post(services.internal_token, b"{}"))
        assert status == 503 and answer["error"] == "unavailable" and tail == b""
    finally:
        listener.stop()
    for sock in held:  # idle keep-alive connections end with the listener
        sock.settimeout(5)
        assert sock.recv(100) == b""
        sock.close()


# -- the worker's client ---------------------------------------------------------------------
@pytest.fixture
def api_server(services: Services) -> Iterator[ApiServer]:
    server = ApiServer(services, "127.0.0.1", free_port(), background=False)
    server.start()
    yield server
    server.stop()


def _client(api_server: ApiServer, services: Services, exchange_url: str) -> DispatcherClient:
    return DispatcherClient(
        api_server.url, internal_token=services.internal_token, exchange_url=exchange_url
    )


def _spy(client: DispatcherClient) -> tuple[list[str], list[str]]:
    """(paths asked of the API, paths asked of the listener) from now on."""
    api_paths: list[str] = []
    listener_paths: list[str] = []
    for transport, paths in ((client.http, api_paths), (client.listener, listener_paths)):
        if transport is None:
            continue
        request = transport.request

        def spy(
            method: str, path: str, _r: Any = request, _p: list[str] = paths, **kw: Any
        ) -> Response:
            _p.append(path)
            return _r(method, path, **kw)

        transport.request = spy  # type: ignore[method-assign]
    return api_paths, listener_paths


def test_the_client_claims_and_completes_through_the_listener(
    api_server: ApiServer, listener: ExchangeListener, services: Services
) -> None:
    client = _client(api_server, services, f"http://127.0.0.1:{listener.port}")
    ids = [uuid.UUID(t) for t in new_tasks(services, 2)]
    to_api, to_listener = _spy(client)
    first = client.claim(ids[0], "w")  # a lone claim
    done = client.complete(first, "succeeded")  # a lone completion
    second = client.claim(ids[1], "w")
    assert (first.attempt, done.status, second.attempt) == (1, "succeeded", 1)
    assert to_api == [] and to_listener == ["/internal/exchange"] * 3
    assert [rows(services, [str(t)])[str(t)]["status"] for t in ids] == ["succeeded", "running"]
    client.close()


def test_the_client_uses_the_api_while_the_listener_is_away_and_comes_back_to_it(
    api_server: ApiServer, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trace_platform.worker import client as client_module

    monkeypatch.setattr(client_module, "LISTENER_PAUSE", 0.5)
    port = free_port()  # nothing listens there yet
    client = _client(api_server, services, f"http://127.0.0.1:{port}")
    ids = [uuid.UUID(t) for t in new_tasks(services, 3)]
    to_api, to_listener = _spy(client)
    assert client.claim(ids[0], "w").attempt == 1
    assert to_listener == ["/internal/exchange"] and to_api == ["/internal/claim"]
    assert client.claim(ids[1], "w").attempt == 1  # within the pause: the API only
    assert to_listener == ["/internal/exchange"] and to_api == ["/internal/claim"] * 2
    listener = _listen(services, port)
    try:
        time.sleep(0.6)
        assert client.claim(ids[2], "w").attempt == 1
        assert to_listener == ["/internal/exchange"] * 2 and len(to_api) == 2
    finally:
        listener.stop()
        client.close()


def test_the_client_stops_using_a_url_that_is_not_a_listener(
    api_server: ApiServer, services: Services
) -> None:
    """A misconfigured exchange URL (here the API under a path it does not serve: 404) is
    given up on for good after one answer; the API's routes carry everything."""
    client = _client(api_server, services, f"{api_server.url}/elsewhere")
    ids = [uuid.UUID(t) for t in new_tasks(services, 2)]
    assert [client.claim(t, "w").attempt for t in ids] == [1, 1]
    assert client.listener is None
    client.close()


# -- what a review found (each failed before its fix) ----------------------------------------
def test_a_client_dripping_its_headers_holds_no_connection_past_the_request_time(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the token too: a request's line and headers have HEADER_SECONDS."""
    monkeypatch.setattr(el, "HEADER_SECONDS", 1.0)
    listener = _listen(services)
    try:
        with socket.create_connection(("127.0.0.1", listener.port), timeout=10) as sock:
            sock.sendall(b"POST /internal/exchange HTTP/1.1\r\n")
            began, ended = time.monotonic(), None
            for i in range(20):  # one header line every 0.4 s
                try:
                    sock.sendall(f"X-Drip-{i}: a\r\n".encode())
                    time.sleep(0.4)
                except OSError:
                    ended = time.monotonic()
                    break
            if ended is None:
                sock.settimeout(5)
                assert sock.recv(100) == b""  # closed
                ended = time.monotonic()
            assert ended - began < 4.5, ended - began
    finally:
        listener.stop()


def test_a_content_length_too_long_for_int_is_refused_and_smuggles_nothing(
    listener: ExchangeListener, services: Services
) -> None:
    token = services.internal_token or ""
    request = (
        f"POST /internal/exchange HTTP/1.1\r\nX-Internal-Token: {token}\r\n"
        f"Content-Length: {'9' * 5000}\r\n\r\nGET /x HTTP/1.1\r\n\r\n"
    ).encode()
    status, answer, tail = _raw(listener.port, request)
    assert status == 413 and answer["error"] == "too_large" and tail == b""


@pytest.mark.parametrize(
    "lines",
    [
        "X-Bad\x00Name: a\r\nX-Other: a\x00b\r\n",  # dropped with what follows, before
        "no colon here\r\nTransfer-Encoding: chunked\r\n",
        " folded: line\r\n",
    ],
)
def test_malformed_header_lines_end_the_request(
    listener: ExchangeListener, services: Services, lines: str
) -> None:
    (fresh,) = new_tasks(services, 1)
    body = json.dumps({"claims": [{"task_id": fresh, "worker_id": "x"}]}).encode()
    status, answer, tail = _raw(listener.port, _post(services.internal_token, body, extra=lines))
    assert status == 400 and tail == b"", answer
    assert rows(services, [fresh])[fresh]["status"] == "queued"


def test_expect_continue_and_head_without_the_token_get_nothing_more(
    listener: ExchangeListener, services: Services
) -> None:
    request = _post(None, b"{}", extra="Expect: 100-continue\r\n")[:-2]  # the body held back
    status, _, tail = _raw(listener.port, request)
    assert status == 401 and tail == b""  # no "100 Continue" first: the answer is the 401
    token = services.internal_token
    head = f"HEAD /internal/exchange HTTP/1.1\r\nX-Internal-Token: {token}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as sock:
        sock.sendall(head)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 405") and got.endswith(b"\r\n\r\n")  # no body


def test_stop_lets_the_answer_being_made_go_out_and_ends_idle_connections(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = services.dispatcher
    exchange = d.exchange

    def slow(*a: Any, **k: Any) -> Any:
        time.sleep(1.0)
        return exchange(*a, **k)

    monkeypatch.setattr(d, "exchange", slow)
    listener = ExchangeListener(d, services.internal_token or "", "127.0.0.1", 0).start()
    (fresh,) = new_tasks(services, 1)
    body = json.dumps({"claims": [{"task_id": fresh, "worker_id": "x"}]}).encode()
    idle = socket.create_connection(("127.0.0.1", listener.port), timeout=5)
    got: list[Any] = []
    asking = threading.Thread(
        target=lambda: got.append(_raw(listener.port, _post(services.internal_token, body)))
    )
    asking.start()
    time.sleep(0.3)  # the request is in
    listener.stop()
    asking.join(10)
    assert got and got[0][0] == 200 and got[0][1]["claims"][0]["claim"]["attempt"] == 1
    assert idle.recv(100) == b""
    idle.close()


def test_a_port_in_use_leaves_the_api_serving_without_a_listener(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    from trace_platform.api.background import exchange_listener

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = services.settings.model_copy(update={"exchange_port": port})
        taken_port = SimpleNamespace(
            settings=settings,
            dispatcher=services.dispatcher,
            internal_token=services.internal_token,
        )
        assert exchange_listener(taken_port) is None  # type: ignore[arg-type]
    assert "cannot listen" in caplog.text


@pytest.mark.parametrize("answer", ["server error", "not an exchange"])
def test_the_client_leaves_a_listener_that_cannot_answer_for_the_api(
    api_server: ApiServer, listener: ExchangeListener, services: Services, answer: str
) -> None:
    """A 5xx pauses the listener (LISTENER_PAUSE), an answer that is not an exchange's ends
    its use; either way this claim is answered by the API's route."""
    client = _client(api_server, services, f"http://127.0.0.1:{listener.port}")
    assert client.listener is not None
    client.listener.request = lambda *a, **k: (  # type: ignore[method-assign]
        Response(503, b'{"error": "x", "message": "down"}')
        if answer == "server error"
        else Response(200, b"<html>hello</html>")
    )
    (t,) = [uuid.UUID(x) for x in new_tasks(services, 1)]
    assert client.claim(t, "w").attempt == 1
    if answer == "server error":
        assert client.listener is not None and not client._listener_up()
    else:
        assert client.listener is None
    client.close()


class _Counting:
    """A Dispatcher stand-in for the listener's own tests: counts its exchanges (every claim
    answered "no such task")."""

    def __init__(self) -> None:
        self.calls = 0

    def exchange(self, completions: list[Any], claims: list[Any]) -> tuple[list[Any], list[Any]]:
        self.calls += 1
        return [], [NotFound("no such task") for _ in claims]


def test_stop_does_nothing_for_a_request_it_has_already_ended() -> None:
    """Requests arriving back to back while the listener stops: none is run after `stop`
    returned (one run then is a lease no worker hears of)."""
    body = json.dumps({"claims": [{"task_id": str(uuid.uuid4()), "worker_id": "w"}]}).encode()
    late = 0
    for _ in range(10):
        d = _Counting()
        listener = ExchangeListener(d, "tok", "127.0.0.1", 0).start()  # type: ignore[arg-type]
        done = threading.Event()

        def ask(port: int = listener.port, done: threading.Event = done) -> None:
            with contextlib.suppress(OSError):
                sock = socket.create_connection(("127.0.0.1", port), timeout=3)
                with sock, sock.makefile("rb") as answers:
                    while not done.is_set() and sock.sendall(_post("tok", body)) is None:
                        if not answers.readline():
                            return
                        while answers.readline() not in (b"\r\n", b""):
                            pass
                        answers.read1(65536)

        askers = [threading.Thread(target=ask) for _ in range(6)]
        for t in askers:
            t.start()
        time.sleep(0.3)
        listener.stop()
        at_stop = d.calls
        time.sleep(0.3)
        done.set()
        for t in askers:
            t.join(5)
        late += d.calls != at_stop
    assert late == 0


def test_stop_ends_at_once_a_request_still_arriving_and_a_connection_that_said_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(el, "HEADER_SECONDS", 0.5)
    listener = ExchangeListener(_Counting(), "tok", "127.0.0.1", 0).start()  # type: ignore[arg-type]
    silent = socket.create_connection(("127.0.0.1", listener.port), timeout=5)
    began = time.monotonic()
    assert silent.recv(10) == b""  # a new connection that sends nothing: closed
    assert time.monotonic() - began < 3
    silent.close()
    with socket.create_connection(("127.0.0.1", listener.port), timeout=5) as one_byte:
        one_byte.sendall(b"P")
        time.sleep(0.2)
        began = time.monotonic()
        listener.stop()
        assert time.monotonic() - began < 2  # no grace for a request not past the token
        assert one_byte.recv(10) == b""


def test_a_client_resetting_mid_body_is_not_an_error(
    listener: ExchangeListener, services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    body = json.dumps({"claims": [{"task_id": str(uuid.uuid4()), "worker_id": "w"}]}).encode()
    sock = socket.create_connection(("127.0.0.1", listener.port), timeout=5)
    sock.sendall(_post(services.internal_token, body)[:-10])
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset
    time.sleep(0.5)
    assert "unhandled error" not in caplog.text and not [
        r for r in caplog.records if r.levelno >= logging.ERROR
    ]


def test_the_client_tries_a_listener_that_stays_away_less_and_less_often(
    api_server: ApiServer, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trace_platform.worker import client as client_module

    monkeypatch.setattr(client_module, "LISTENER_PAUSE", 0.2)
    monkeypatch.setattr(client_module, "LISTENER_PAUSE_MAX", 0.5)
    port = free_port()  # nothing listens there yet
    client = _client(api_server, services, f"http://127.0.0.1:{port}")
    ids = [uuid.UUID(t) for t in new_tasks(services, 4)]
    # The pause starts at the failure: bracket that moment itself (not the whole claim, whose
    # fallback through the API may take half a second on a slow machine).
    failed_within: list[tuple[float, float]] = []
    listener_failed = client._listener_failed

    def timed(e: Exception) -> None:
        began = time.monotonic()
        listener_failed(e)
        failed_within.append((began, time.monotonic()))

    monkeypatch.setattr(client, "_listener_failed", timed)
    for t, pause in zip(ids[:3], (0.2, 0.4, 0.5), strict=True):
        time.sleep(max(0.0, client._listener_back_at - time.monotonic()) + 0.02)
        assert client.claim(t, "w").attempt == 1  # by the API's route
        began, ended = failed_within[-1]
        # (a microsecond either side for the float sums)
        assert began - 1e-6 <= client._listener_back_at - pause <= ended + 1e-6, failed_within
    assert len(failed_within) == 3
    listener = _listen(services, port)
    try:
        time.sleep(0.55)
        to_api, to_listener = _spy(client)
        assert client.claim(ids[3], "w").attempt == 1
        assert to_listener == ["/internal/exchange"] and to_api == []
        assert client._listener_failures == 0  # an answer: the next failure pauses 0.2 s again
    finally:
        listener.stop()
        client.close()


# -- issue 38: what a caller without the token may hold ---------------------------------------
def _closed_by(socks: list[socket.socket], deadline: float) -> list[socket.socket]:
    """Waits (on the sockets themselves) until each is closed by the listener or `deadline`
    passes; the ones still open then."""
    open_ = set(socks)
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ)
        while open_ and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                try:
                    ended = key.fileobj.recv(4096) == b""  # type: ignore[union-attr]
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:  # reset: closed too
                    ended = True
                if ended:
                    sel.unregister(key.fileobj)
                    open_.discard(key.fileobj)  # type: ignore[arg-type]
    return list(open_)


def test_half_sent_requests_without_the_token_do_not_starve_the_workers(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 connections that start a request and never finish its headers (nor name the
    token) leave a worker's exchange answered at once, and are all closed by the header
    deadline. (Before: they held every one of the 256 places for REQUEST_SECONDS, and the
    worker's connection was closed unread.)"""
    monkeypatch.setattr(el, "HEADER_SECONDS", 2.0)
    listener = _listen(services)
    half: list[socket.socket] = []
    try:
        for i in range(300):
            sock = socket.create_connection(("127.0.0.1", listener.port), timeout=5)
            sock.sendall(b"POST /internal/exchange HTTP/1.1\r\nHost: x\r\n" if i % 3 else b"P")
            half.append(sock)
        held_from = time.monotonic()
        (fresh,) = new_tasks(services, 1)
        body = json.dumps({"claims": [{"task_id": fresh, "worker_id": "x"}]}).encode()
        began = time.monotonic()
        status, answer, _ = _raw(listener.port, _post(services.internal_token, body))
        assert status == 200 and answer["claims"][0]["claim"]["attempt"] == 1
        assert time.monotonic() - began < 3.0  # (a loaded 2-core machine: ms when idle)
        # Every half-sent request ends by its header deadline (the watchdog looks twice a
        # second; the rest is slack for a loaded machine: the wait ends as they close).
        assert _closed_by(half, held_from + el.HEADER_SECONDS + 3.0) == []
    finally:
        for sock in half:
            sock.close()
        listener.stop()


def test_headers_past_their_size_are_refused_with_or_without_the_token(
    listener: ExchangeListener, services: Services
) -> None:
    big = "".join(f"X-Pad-{i}: {'a' * 1000}\r\n" for i in range(40))  # 40 KB, 40 lines
    for token in (services.internal_token, None):
        status, answer, tail = _raw(listener.port, _post(token, b"{}", extra=big))
        assert status == 431 and tail == b"", answer
        assert f"over {el.MAX_HEADER_BYTES} bytes" in answer["message"]
    line = f"POST /internal/exchange?{'a' * el.MAX_HEADER_BYTES} HTTP/1.1\r\n\r\n".encode()
    status, answer, tail = _raw(listener.port, line)
    assert status == 431 and tail == b"", answer
    # A worker's headers with the most lease tokens an exchange carries are well within it.
    tokens = ",".join(str(uuid.uuid4()) for _ in range(100))
    extra = f"X-Lease-Tokens: {tokens}\r\n"
    assert _raw(listener.port, _post(services.internal_token, b"{}", extra=extra))[0] == 422


def test_a_body_slower_than_its_rate_is_refused_before_the_request_time(
    listener: ExchangeListener, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(el, "BODY_SECONDS", 0.3)
    monkeypatch.setattr(el, "BODY_BYTES_PER_SECOND", 1_000_000)
    body = b" " * 500_000  # due 0.8 s after its headers; only half of it is ever sent
    began = time.monotonic()
    status, answer, tail = _raw(
        listener.port, _post(services.internal_token, body)[:-250_000], read_timeout=10
    )
    assert status == 408 and tail == b"" and time.monotonic() - began < 5, answer
