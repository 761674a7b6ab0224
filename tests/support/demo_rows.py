"""The Spark-made datasets of a demo run, kept in this process for a later test that needs the
same run's results: test_monad_demo's golden path leaves its run's here, and test_spark_cluster
compares its cluster run with them instead of running the same DAG over the same chain locally
again (when it is alone, or on another xdist worker, it runs its own). A run is reused only for
the same chain (its head block's hash: every block under it the same), DAG text and range.

Both tests carry `xdist_group(GROUP)`, listed in tests/support/scheduling.SHARED_GROUPS: with
`--dist loadgroup` the suite's scheduler runs both modules on one worker, in collection order
(the golden path first)."""

from __future__ import annotations

import json
from typing import Any

from trace_platform.chain import Rpc
from trace_platform.lite.demo.data import ANALYTICS
from trace_platform.services import Services

GROUP = "demo_seed3"
SPARK_DATASETS = ("erc20_transfers", "staking_events", *ANALYTICS)
_RUNS: dict[tuple[str, str, str], dict[str, list[Any]]] = {}


def run_key(rpc_url: str, dag: str, config: dict[str, Any]) -> tuple[str, str, str]:
    with Rpc(rpc_url) as rpc:
        head = rpc.call("eth_getBlockByNumber", "latest", False)["hash"]
    return head, dag.replace(rpc_url, "RPC_URL"), json.dumps(config, sort_keys=True)


def spark_rows(services: Services, actor: Any) -> dict[str, list[Any]]:
    """Every Spark-made dataset's rows, in a fixed order."""
    out = {}
    for name in SPARK_DATASETS:
        rows = services.query.query(actor, f"SELECT * FROM {name}").as_json()["rows"]
        out[name] = sorted(rows, key=repr)
    return out


def remember(key: tuple[str, str, str], rows: dict[str, list[Any]]) -> None:
    _RUNS[key] = rows


def recall(key: tuple[str, str, str]) -> dict[str, list[Any]] | None:
    return _RUNS.get(key)
