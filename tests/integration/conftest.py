"""Fixtures the integration modules share."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from trace_platform.db.embedded import free_port
from trace_platform.lite.stack import ApiServer
from trace_platform.services import Services


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
