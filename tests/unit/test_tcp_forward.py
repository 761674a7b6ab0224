"""The sandbox's forward to a Spark Connect endpoint: bytes both ways, the URL it rewrites,
and nothing left open once the task is over."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from trace_platform.config import Settings
from trace_platform.sandbox.tcp_forward import TcpForward, connect_address


def listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


@pytest.fixture
def echo() -> Iterator[int]:
    """An upstream that echoes each connection's bytes back."""
    srv = listener()

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return

            def one(c: socket.socket) -> None:
                with c:
                    while data := c.recv(65536):
                        c.sendall(data)

            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def recv_exactly(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "connection closed early"
        out += chunk
    return out


def test_bytes_pass_both_ways_on_many_connections(echo: int) -> None:
    fwd = TcpForward(listener(), "127.0.0.1", echo)
    try:
        payload = bytes(range(256)) * 4096  # 1 MiB: more than one recv
        conns = [socket.create_connection(("127.0.0.1", fwd.port), timeout=10) for _ in range(3)]
        for c in conns:
            c.sendall(payload)
        for c in conns:
            assert recv_exactly(c, len(payload)) == payload
            c.close()
    finally:
        fwd.close()


def test_close_cuts_open_connections_and_refuses_new_ones(echo: int) -> None:
    fwd = TcpForward(listener(), "127.0.0.1", echo)
    c = socket.create_connection(("127.0.0.1", fwd.port), timeout=10)
    c.sendall(b"x")
    assert recv_exactly(c, 1) == b"x"
    fwd.close()
    assert c.recv(1) == b""  # cut
    c.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", fwd.port), timeout=2)


def test_an_unreachable_upstream_closes_the_inner_connection() -> None:
    dead = listener()
    port = dead.getsockname()[1]
    dead.close()
    fwd = TcpForward(listener(), "127.0.0.1", port)
    try:
        c = socket.create_connection(("127.0.0.1", fwd.port), timeout=10)
        assert c.recv(1) == b""
        c.close()
    finally:
        fwd.close()


def test_connect_urls() -> None:
    assert connect_address("sc://spark.internal:443/;use_ssl=true;token=t") == (
        "spark.internal",
        443,
        "/;use_ssl=true;token=t",
    )
    assert connect_address("sc://10.0.0.5") == ("10.0.0.5", 15002, "")
    for bad in ("sc://", "spark://m:7077", "http://x"):
        with pytest.raises(ValueError, match="Spark Connect URL"):
            connect_address(bad)
    with pytest.raises(ValueError, match="Spark Connect URL"):
        Settings(spark_master="sc://")


def test_only_local_or_spark_connect_masters_are_accepted() -> None:
    for master in ("spark://10.0.0.5:7077", "yarn", "k8s://https://k8s:443"):
        with pytest.raises(ValueError, match="Spark Connect"):
            Settings(spark_master=master)
    for master in ("local[*]", "local[2]", "sc://10.0.0.5:15002"):
        assert Settings(spark_master=master).spark_master == master
