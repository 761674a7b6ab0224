"""A real webhook receiver on 127.0.0.1 for delivery tests: the demo's (lite/demo/receiver.py),
at `/hook`. It verifies every request with the `standardwebhooks` package (a forged or missing
signature answers 401 and is recorded as not verified), records what arrived, and can be told
to answer otherwise (`answer`: fail, Retry-After, redirect). Tests wait on its arrivals
(`wait`), never on sleeps."""

from __future__ import annotations

from trace_platform.lite.demo.receiver import Answer, Arrival, DemoReceiver

__all__ = ["Arrival", "Receiver"]


class Receiver(DemoReceiver):
    def __init__(self, port: int, secret: str | None = None, answer: Answer | None = None) -> None:
        super().__init__(secret, port, path="/hook", answer=answer)
