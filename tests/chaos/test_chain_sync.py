"""Raw chain sync through a DAG: a real anvil devnet, Cryo, the object store, real workers."""

from __future__ import annotations

import functools
import io
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.support.dags import admin, finished_run
from tests.support.datasets import committed_keys
from tests.support.devnet import egress_to
from tests.support.invariants import assert_invariants
from tests.support.wait import wait_for
from trace_platform.chain import Rpc
from trace_platform.config import Settings
from trace_platform.devnet import ChainSpec, Devnet
from trace_platform.lite.stack import LiteStack
from trace_platform.objectstore import make_store

pytestmark = pytest.mark.slow
# Three ranges of 200 blocks (CHUNK): ranges ingested side by side and one after another, and
# long enough (seconds each) for a worker to be killed mid-ingest.
SPEC = ChainSpec(seed=5, blocks=600, accounts=100, validators=6, epoch_blocks=100)
CHUNK = 200
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dags" / "monad_sync.yaml"


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = Devnet(tmp_path_factory.mktemp("devnet"))
    info, _ = d.up(SPEC)
    with egress_to(info.url):
        yield info.url
    d.down()


def run_sync(
    stack: LiteStack,
    rpc_url: str,
    first: int,
    last: int,
    chunk: int = CHUNK,
    on_running: Any = None,
) -> uuid.UUID:
    svc, me = stack.services, admin(stack.services)
    text = EXAMPLE.read_text().replace("http://127.0.0.1:8545", rpc_url)
    svc.control.deploy(me, text, str(EXAMPLE))
    run = svc.control.trigger(
        me, "monad_sync", config={"from_block": first, "to_block": last, "chunk_size": chunk}
    )
    run_id = run["run_id"]

    def ingesting() -> bool:
        tasks = svc.control.show_run(me, run_id)["tasks"]
        return any(t["job"] == "ingest" and t["status"] == "running" for t in tasks)

    if on_running is not None:
        wait_for(ingesting, 120, "an ingest task to run")
        on_running()
    tasks = finished_run(svc, run_id, 300)
    assert all(t["status"] == "succeeded" for t in tasks), [t["last_error"] for t in tasks]
    assert sum(t["job"] == "ingest" for t in tasks) == -(-(last - first + 1) // chunk)
    return run_id


@functools.cache
def node_counts(url: str) -> tuple[int, int]:
    """The node's transactions and logs of the chain (the module's devnet: never changed)."""
    rpc = Rpc(url)
    head = SPEC.blocks
    counts = rpc.batch([("eth_getBlockTransactionCountByNumber", [hex(b)]) for b in range(head)])
    n_tx = sum(int(c, 16) for c in counts)
    n_logs = len(rpc.call("eth_getLogs", {"fromBlock": "0x0", "toBlock": hex(head - 1)}))
    return n_tx, n_logs


def check_datasets(stack: LiteStack, settings: Settings, url: str) -> None:
    """Every dataset equals what the node reports: no duplicates, no gaps."""
    svc, me = stack.services, admin(stack.services)
    n_tx, n_logs = node_counts(url)
    store = make_store(settings)
    counts = {}
    for name in ("blocks", "transactions", "logs", "traces"):
        ds = svc.control.show_dataset(me, name)
        files = committed_keys(svc, name)
        frame = pl.concat([pl.read_parquet(io.BytesIO(store.get(k))) for k in files])
        counts[name] = (frame.height, ds["row_count"])
        if name == "blocks":
            assert sorted(frame["block_number"].to_list()) == list(range(SPEC.blocks))
    assert counts["blocks"] == (SPEC.blocks, SPEC.blocks)
    assert counts["transactions"] == (n_tx, n_tx)
    assert counts["logs"] == (n_logs, n_logs)
    assert counts["traces"][0] == counts["traces"][1] >= n_tx


def test_sync_matches_the_node_and_reruns_do_not_duplicate(
    settings: Settings, dsn: str, chain: str
) -> None:
    with LiteStack(
        settings, workers=2, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"}
    ) as stack:
        for _ in range(2):  # the second run re-ingests the same ranges
            run_sync(stack, chain, 0, SPEC.blocks - 1)
            check_datasets(stack, settings, chain)
        assert_invariants(stack.services)


def test_killed_worker_mid_ingest_retries_without_duplicates_or_gaps(
    settings: Settings, dsn: str, chain: str
) -> None:
    with LiteStack(
        settings, workers=1, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"}
    ) as stack:
        killed: list[int] = []

        def kill_once() -> None:
            victim = stack.workers[0]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            killed.append(victim.pid)
            stack.add_worker()

        run_sync(stack, chain, 0, SPEC.blocks - 1, on_running=kill_once)
        assert killed
        check_datasets(stack, settings, chain)
        with stack.services.pool.connection() as conn:
            reaped = conn.execute(
                "SELECT count(*) AS n FROM task_attempts WHERE outcome = 'lease_expired'"
            ).fetchone()
        assert reaped is not None and reaped["n"] >= 1
        assert_invariants(stack.services)
