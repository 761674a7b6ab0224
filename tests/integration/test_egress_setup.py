"""An attempt's set-up (its host's start, secrets, its RPC names' resolution) heartbeats (issue
38): a DAG author whose DNS server answers slowly, or a host slow to start, cannot make the
attempt lose its lease before it runs. A real API, Postgres queue and operator host; the
reaper runs as the API's would."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.integration.test_worker_loop import Loop
from trace_platform.config import Settings
from trace_platform.services import Services
from trace_platform.worker.client import DispatcherClient

SLOW = "slow.rpc.test"


class Reaper:
    """Reaps every 0.1 s, as the API's reaper does; `past(t)`: an event set once a reap began
    after the wall-clock time `t`."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.waiting: list[tuple[datetime, threading.Event]] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def past(self, t: datetime) -> threading.Event:
        event = threading.Event()
        with self.lock:
            self.waiting.append((t, event))
        return event

    def run(self) -> None:
        while not self.stop.wait(0.1):
            began = datetime.now(UTC)
            self.services.dispatcher.reap()
            with self.lock:
                for t, event in self.waiting:
                    if began > t:
                        event.set()


@pytest.fixture
def reaper(services: Services) -> Iterator[Reaper]:
    r = Reaper(services)
    r.thread.start()
    yield r
    r.stop.set()
    r.thread.join()


def test_a_slowly_resolving_rpc_name_keeps_the_lease(
    settings: Settings,
    services: Services,
    client: DispatcherClient,
    dsn: str,
    reaper: Reaper,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The name answers only once the reaper has run past the lease the attempt held when the
    name was asked. Before, nothing heartbeat until the set-up ended: the attempt was reaped
    while its name resolved."""
    real = socket.getaddrinfo
    tasks: list[uuid.UUID] = []
    seen: list[str] = []

    def slow(host: Any, *args: Any, **kw: Any) -> Any:
        if host == SLOW:
            lease = services.dispatcher.get_task(tasks[0]).lease_until
            assert lease is not None
            assert reaper.past(lease + timedelta(seconds=0.2)).wait(30), "no reap past it"
            seen.append(services.dispatcher.get_task(tasks[0]).status)  # past that lease
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("8.8.8.8", 0))]
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    loop = Loop(settings, services, client, dsn, 1)
    try:
        tasks.extend(loop.submit(max_attempts=1, rpc_url=f"http://{SLOW}:8545/"))
        loop.start()
        loop.wait_done(tasks)
        # Still running once its first lease was over: its set-up heartbeat meanwhile.
        assert seen == ["running"], seen
        assert loop.status(tasks[0]) == ("succeeded", 1)
    finally:
        loop.abort.set()
        loop.close()
        loop.driver.close()
