"""The demo receiver (lite/demo/receiver.py, also the delivery tests' and act_bench's) queues a
burst of connections instead of dropping them: with socketserver's backlog of 5, two Delivery
Services sending 8 at a time had some connections dropped, each then waiting 1 s for a SYN
retry (act_bench measured 161 deliveries/s, p99 attempt 1,022 ms; 606/s once queued)."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler

from trace_platform.lite.demo.receiver import ReceiverServer

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
