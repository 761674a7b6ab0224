"""The egress gateway's upstream rule (issue 38): only public addresses unless the admin allows
an upstream, names that do not resolve refused, and every connection to the address that was
checked (a DNS answer that changes later cannot redirect it). Loopback only: the "private"
services here are servers on 127.0.0.x."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from trace_platform.config import get_settings
from trace_platform.contract import TaskPayload
from trace_platform.sandbox import gateway
from trace_platform.sandbox.gateway import EgressRefused, check_upstream
from trace_platform.worker.wrapper import Wrapper

PLATFORM = {8765, 5432}


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8545/",  # a loopback service that is not the platform's
        "http://localhost:6379/",
        "http://127.0.0.2:8545/",
        "http://[::1]:8545/",
        "http://10.1.2.3:8545/",  # private networks
        "http://172.16.0.1/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",  # carrier-grade NAT
        "http://169.254.169.254/latest/meta-data/",  # a cloud's metadata service
        "http://[fe80::1]:8545/",
        "http://[fd00::1]:8545/",
        "http://224.0.0.1/",  # multicast
        "http://240.0.0.1/",  # reserved
        "http://[64:ff9b::7f00:1]:8545/",  # 127.0.0.1 through a NAT64 prefix
        "http://[2002:7f00:1::1]:8545/",  # 127.0.0.1 in 6to4
        "http://no-such-host.invalid:8545/",  # fail-closed: a name that does not resolve
    ],
)
def test_non_public_and_unresolvable_upstreams_are_refused(url: str) -> None:
    with pytest.raises(EgressRefused):
        check_upstream(url, PLATFORM)


def test_an_admin_allowed_upstream_passes_and_nothing_else() -> None:
    allow = gateway.parse_allow(["127.0.0.1:8545", "node.internal", "[::1]:9"])
    assert check_upstream("http://127.0.0.1:8545/", PLATFORM, allow).address == "127.0.0.1"
    assert check_upstream("http://[::1]:9/", PLATFORM, allow).address == "::1"
    # A name the admin allows need not resolve now: each request checks and pins it then.
    named = check_upstream("http://node.internal:8545/", PLATFORM, allow)
    assert named.address is None
    with pytest.raises(EgressRefused):  # another port of an allowed address is not allowed
        check_upstream("http://127.0.0.1:8546/", PLATFORM, allow)
    with pytest.raises(EgressRefused, match="platform's own services"):  # never, whatever
        check_upstream("http://127.0.0.1:5432/", PLATFORM, gateway.parse_allow(["127.0.0.1"]))
    with pytest.raises(ValueError):
        gateway.parse_allow(["host:port"])


class _Named(BaseHTTPRequestHandler):
    """Answers with its own name and the Host header it was sent."""

    protocol_version = "HTTP/1.1"
    name = ""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = f'{{"server":"{self.name}","host":"{self.headers["Host"]}"}}'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


def _serve(address: str, port: int, name: str) -> ThreadingHTTPServer:
    handler = type(f"Named_{name}", (_Named,), {"name": name})
    server = ThreadingHTTPServer((address, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def rpc_and_internal() -> Iterator[int]:
    """The RPC the check approved on 127.0.0.1:P, and an internal service on 127.0.0.2:P."""
    rpc = _serve("127.0.0.1", 0, "rpc")
    internal = _serve("127.0.0.2", rpc.server_port, "internal")
    yield rpc.server_port
    for s in (rpc, internal):
        s.shutdown()
        s.server_close()


class _Policy:
    isolated = True


class _Host:
    """A stand-in for a sandboxed host: its listeners are on this process's loopback."""

    policy = _Policy()

    def listen(self) -> socket.socket:
        return socket.create_server(("127.0.0.1", 0))


def test_a_rebinding_name_cannot_turn_the_gateway_to_another_address(
    rpc_and_internal: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The name answers 127.0.0.1 (the allowed RPC) when checked, then 127.0.0.2 (an internal
    service) to every later query: the gateway still reaches only the address it checked, and
    sends the name as the Host header. Before, the check resolved it, and each connection
    resolved it again."""
    port = rpc_and_internal
    name = "rpc.rebind.test"
    answers = iter(["127.0.0.1"])
    real = socket.getaddrinfo

    def rebinding(host: Any, *args: Any, **kw: Any) -> Any:
        if host == name:
            addr = next(answers, "127.0.0.2")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (addr, args[0] or 0))]
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    monkeypatch.setenv("TRACE_EGRESS_ALLOW", f"127.0.0.1:{port}")
    get_settings.cache_clear()
    try:
        wrapper = Wrapper(None, None, None, home=tmp_path)  # type: ignore[arg-type]
    finally:
        get_settings.cache_clear()
    task = TaskPayload.model_construct(config={})
    gateways: list[Any] = []
    _, env = wrapper._egress(
        _Host(),  # type: ignore[arg-type]
        task,
        {"RPC_URL": f"http://{name}:{port}/"},
        gateways,
    )
    try:
        assert env["RPC_URL"].startswith("http://127.0.0.1:")
        for _ in range(3):  # each a new connection: none resolves the name again
            with httpx.Client(timeout=5) as c:
                answer = c.post(env["RPC_URL"], content=b"{}").json()
            assert answer == {"server": "rpc", "host": f"{name}:{port}"}
    finally:
        for g in gateways:
            g.close()
