"""The metrics settings: a port that would clash with the API's listeners is refused naming
it, and operators' egress can reach neither the API's nor the worker's /metrics."""

from __future__ import annotations

import pytest

from trace_platform.config import Settings
from trace_platform.worker.task_network import platform_ports


@pytest.mark.parametrize("clash", [{"api_port": 9465}, {"exchange_port": 9465}])
def test_a_metrics_port_on_the_apis_own_is_refused(clash: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="TRACE_METRICS_PORT=9465"):
        Settings(metrics_port=9465, **clash)


def test_no_operator_reaches_the_metrics_ports() -> None:
    s = Settings(metrics_port=9465, worker_metrics_port=9466)
    assert {9465, 9466} <= platform_ports(s, [], [])
