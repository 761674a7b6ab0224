"""The demo receiver (lite/demo/receiver.py, also the delivery tests' and act_bench's) queues a
burst of connections instead of dropping them: with socketserver's backlog of 5, two Delivery
Services sending 8 at a time had some connections dropped, each then waiting 1 s for a SYN
retry (act_bench measured 161 deliveries/s, p99 attempt 1,022 ms; 606/s once queued)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from trace_platform.lite.demo import receiver as receiver_module
from trace_platform.lite.demo.receiver import MAX_BODY, DemoReceiver, ReceiverServer

BURST = 40  # more than two services' sends in flight, well under the backlog


def test_a_burst_of_connections_is_queued_while_none_is_accepted_yet() -> None:
    server = ReceiverServer(("127.0.0.1", 0), BaseHTTPRequestHandler)  # listening; nothing accepts
    socks: list[socket.socket] = []
    try:
        connected = 0
        for _ in range(BURST):
            s = socket.socket()
            socks.append(s)
            s.settimeout(0.5)
            try:
                s.connect(server.server_address)
                connected += 1
            except OSError:  # a dropped SYN: the connect waits for its retry, past the timeout
                pass
        assert connected == BURST
    finally:
        for s in socks:
            s.close()
        server.server_close()


def _answer(sock: socket.socket, timeout: float = 5.0) -> bytes | None:
    """The receiver's answer's head, or what it sent before closing (b"": closed, nothing
    sent); None: still open, nothing sent, after `timeout`."""
    sock.settimeout(timeout)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
            if b"\r\n\r\n" in got:
                break
    except TimeoutError:
        return got or None
    return got


def _post(length: str) -> bytes:
    return f"POST /alerts HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[DemoReceiver]:
    monkeypatch.setattr(receiver_module, "IDLE_SECONDS", 0.5)
    monkeypatch.setattr(ReceiverServer, "max_connections", 2)
    recv = DemoReceiver().start()
    yield recv
    recv.stop()


def test_a_body_it_will_not_read_is_answered_at_once_unread(receiver: DemoReceiver) -> None:
    """A negative Content-Length (which read to the end of the connection), one past MAX_BODY
    (read up to 1 MiB before, then refused) or one of 5,000 digits: an answer at once, though
    the sender sends no body and keeps the connection open."""
    for length, status in (("-1", b" 400 "), (str(MAX_BODY + 1), b" 413 "), ("9" * 5000, b" 413 ")):
        with socket.create_connection(("127.0.0.1", receiver.port)) as s:
            s.sendall(_post(length))
            answer = _answer(s, 2.0)
            assert answer is not None and status in answer.split(b"\r\n")[0], length
    assert receiver.rejected == 2 and not receiver.verified  # the two 413s, as not verified


def test_idle_connections_are_closed_and_their_number_is_bounded(receiver: DemoReceiver) -> None:
    """Two connections (the bound here) that send nothing hold the receiver's two slots: a third
    request waits, queued, and is answered once they are closed for being idle (0.5 s here)."""
    t0 = time.monotonic()
    idle = [socket.create_connection(("127.0.0.1", receiver.port)) for _ in range(2)]
    try:
        with socket.create_connection(("127.0.0.1", receiver.port)) as s:
            s.sendall(_post("0"))
            answer = _answer(s, 5.0)
            waited = time.monotonic() - t0
        assert answer is not None and b" 401 " in answer  # unsigned
        assert waited >= 0.4  # not before the idle ones were closed
        for sock in idle:
            assert _answer(sock, 5.0) == b""  # closed by the receiver, nothing sent
    finally:
        for sock in idle:
            sock.close()
