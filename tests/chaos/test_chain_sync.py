"""Raw chain sync through a DAG: a real anvil devnet, Cryo, the object store, real workers."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from tests.support.dags import admin
from tests.support.invariants import assert_invariants
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.devnet import ChainSpec, Devnet
from trace_platform.devnet.rpc import Rpc
from trace_platform.lite.stack import LiteStack
from trace_platform.objectstore import list_all, make_store

pytestmark = pytest.mark.slow
SPEC = ChainSpec(seed=5, blocks=300, accounts=40, validators=4, epoch_blocks=50)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dags" / "monad_sync.yaml"


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = Devnet(tmp_path_factory.mktemp("devnet"))
    info, _ = d.up(SPEC)
    yield info.url
    d.down()


def run_sync(stack: LiteStack, rpc_url: str, first: int, last: int) -> uuid.UUID:
    svc, me = stack.services, admin(stack.services)
    text = EXAMPLE.read_text().replace("http://127.0.0.1:8545", rpc_url)
    svc.control.deploy(me, text, str(EXAMPLE))
    run = svc.control.trigger(
        me, "monad_sync", config={"from_block": first, "to_block": last, "chunk_size": 100}
    )
    run_id = run["run_id"]

    def done() -> bool:
        tasks = svc.control.show_run(me, run_id)["tasks"]
        return bool(tasks) and all(t["status"] in ("succeeded", "failed") for t in tasks)

    wait_for(done, 240, "sync run")
    tasks = svc.control.show_run(me, run_id)["tasks"]
    assert all(t["status"] == "succeeded" for t in tasks), [t["last_error"] for t in tasks]
    assert sum(t["job"] == "ingest" for t in tasks) == 3
    return run_id


def test_sync_matches_the_node_and_reruns_do_not_duplicate(
    settings: Settings, dsn: str, chain: str
) -> None:
    rpc = Rpc(chain)
    head = SPEC.blocks
    n_tx = sum(
        int(rpc.call("eth_getBlockTransactionCountByNumber", hex(b)), 16) for b in range(0, head)
    )
    n_logs = len(rpc.call("eth_getLogs", {"fromBlock": "0x0", "toBlock": hex(head - 1)}))
    with LiteStack(
        settings, workers=2, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"}
    ) as stack:
        svc, me = stack.services, admin(stack.services)
        store = make_store(settings)
        for attempt in range(2):  # the second run re-ingests the same ranges
            run_sync(stack, chain, 0, head - 1)
            counts = {}
            for name in ("blocks", "transactions", "logs", "traces"):
                ds = svc.control.show_dataset(me, name)
                prefix = (
                    f"org/{me.org_id}/dataset/{ds['dataset_uuid']}/version/{ds['current_version']}/"
                )
                files = [o.key for o in list_all(store, prefix)]
                frame = pl.concat([pl.read_parquet(io.BytesIO(store.get(k))) for k in files])
                counts[name] = (frame.height, ds["row_count"])
                if name == "blocks":
                    assert frame["block_number"].n_unique() == frame.height  # no duplicates
            assert counts["blocks"] == (head, head), attempt
            assert counts["transactions"] == (n_tx, n_tx), attempt
            assert counts["logs"] == (n_logs, n_logs), attempt
            assert counts["traces"][0] == counts["traces"][1] >= n_tx
        assert_invariants(svc)
