"""The demo DAG on a small devnet, shared by the tests that run it whole."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from trace_platform.devnet import ChainInfo, ChainSpec, Devnet
from trace_platform.lite.demo.plan import DEVNET_REQUESTS_PER_SECOND
from trace_platform.lite.stack import egress_allow

DEMO = Path(__file__).resolve().parents[2] / "examples" / "dags" / "monad_demo.yaml"


def small_demo_dag(url: str) -> str:
    """The demo DAG pointed at `url`, its windows and hot window sized for a 300-block chain,
    Cryo at the demo's devnet pace (not the file's 200 requests/s)."""
    return (
        DEMO.read_text()
        .replace("http://127.0.0.1:8545", url)
        .replace("requests_per_second: 200", f"requests_per_second: {DEVNET_REQUESTS_PER_SECOND}")
        .replace("window_blocks: 500", "window_blocks: 120")
        .replace("window_blocks: 100", "window_blocks: 50")
        .replace("size: 2000", "size: 300")
    )


@contextmanager
def egress_to(*urls: str) -> Iterator[None]:
    """Workers started meanwhile (a LiteStack's read this process's environment) may reach
    each URL's host:port: an RPC on loopback, such as a devnet, is refused unless the admin
    allows it (TRACE_EGRESS_ALLOW). A Lite stack allows its own home's devnet by itself."""
    entries = [urlsplit(u).netloc.rsplit("@", 1)[-1] or u for u in urls]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "TRACE_EGRESS_ALLOW", egress_allow(os.environ.get("TRACE_EGRESS_ALLOW", ""), *entries)
        )
        yield


def devnet_fixture(spec: ChainSpec) -> Callable[..., Any]:
    """A module-scoped fixture: a devnet of `spec`, as (RPC URL, chain info)."""

    @pytest.fixture(scope="module")
    def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ChainInfo]]:
        d = Devnet(tmp_path_factory.mktemp("devnet"))
        info, c = d.up(spec)
        with egress_to(info.url):
            yield info.url, c
        d.down()

    return devnet
