"""Fixtures the integration modules share."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.servers import secured_api
from trace_platform.config import Settings
from trace_platform.db.embedded import free_port
from trace_platform.lite.stack import ApiServer
from trace_platform.services import Services
from trace_platform.worker.client import DispatcherClient


@pytest.fixture
def api(services: Services) -> Iterator[httpx.Client]:
    """The API over a real socket, this test's services behind it; the client sends the
    internal token (user calls add their own key)."""
    server = ApiServer(services, "127.0.0.1", free_port(), background=False)
    server.start()
    headers = {"X-Internal-Token": services.internal_token or ""}
    with httpx.Client(base_url=server.url, timeout=10, headers=headers) as client:
        client.services = services  # type: ignore[attr-defined]
        yield client
    server.stop()


@pytest.fixture
def client(services: Services) -> Iterator[DispatcherClient]:
    """A worker's client of the internal API over a real socket (retrying transport errors
    twice, as a worker does), this test's services behind it."""
    server = ApiServer(services, "127.0.0.1", free_port(), background=False)
    server.start()
    c = DispatcherClient(server.url, internal_token=services.internal_token, retries=2)
    yield c
    c.close()
    server.stop()


@pytest.fixture
def secure(settings: Settings, dsn: str) -> Iterator[tuple[Services, str]]:
    """An API that requires keys, over this test's database: (services, base URL)."""
    with secured_api(settings, dsn) as running:
        yield running
