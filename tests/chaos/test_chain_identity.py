"""Block hashes are part of the data's identity (issue 12): a chain reset under the same id is
detected by the demo and re-synced; a reorg below the tip is detected by tip following, the
reorged range re-read, and everything built from it recomputed, until the analytics equal the
node's views again."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from tests.support.dags import admin, finished_run
from tests.support.invariants import assert_invariants
from trace_platform.chain import Rpc, calldata
from trace_platform.config import Settings
from trace_platform.dag.schema import DagSpec
from trace_platform.dag.whole import implicit_pool, task_pool
from trace_platform.db.pool import embedded_cluster
from trace_platform.devnet import ChainSpec, Devnet
from trace_platform.devnet.chain import DEPLOYER
from trace_platform.lite.demo import run_demo, saved_rows
from trace_platform.lite.stack import LiteStack
from trace_platform.registry.reserved import PLATFORM_DAG
from trace_platform.services import Services

pytestmark = pytest.mark.slow
DEMO = Path(__file__).resolve().parents[2] / "examples" / "dags" / "monad_demo.yaml"


def identities(svc: Services, dataset: str) -> dict[int, str]:
    """range start -> the committed last block hash, in the dataset's current version."""
    with svc.pool.connection() as conn:
        rows = conn.execute(
            "SELECT c.range_start, c.last_block_hash FROM dataset_commits c "
            "JOIN dataset_current cur USING (dataset_version) "
            "JOIN datasets d ON d.dataset_uuid = cur.dataset_uuid WHERE d.dataset_name = %s",
            (dataset,),
        ).fetchall()
    return {r["range_start"]: r["last_block_hash"] for r in rows}


@pytest.fixture
def demo_home() -> Iterator[Path]:
    """A TRACE_HOME the embedded Postgres (run as its own user) can enter: pytest's tmp_path
    lives under a root-only directory."""
    home = Path(tempfile.mkdtemp(prefix="trace-demo-", dir="/tmp"))
    home.chmod(0o755)
    yield home
    embedded_cluster(Settings(home=home)).stop()  # the demo leaves it running, as `trace` does
    shutil.rmtree(home, ignore_errors=True)


def test_a_chain_reset_under_the_same_id_is_detected_and_resynced(
    demo_home: Path, tmp_path: Path
) -> None:
    """Two demo runs on one TRACE_HOME: the second on a devnet regenerated with another seed
    (same chain id, same heights, other blocks). It must not reuse the first chain's data."""
    settings = Settings(home=demo_home, auth="permissive")
    first = ChainSpec(seed=11, blocks=400, accounts=30, validators=3, epoch_blocks=100)
    second = ChainSpec(seed=12, blocks=400, accounts=30, validators=3, epoch_blocks=100)
    out = tmp_path / "demo.log"
    with out.open("w") as log:
        console = Console(file=log, width=200)
        assert run_demo(settings, chunk_size=200, devnet_spec=first, console=console) == 0
        assert run_demo(settings, chunk_size=200, devnet_spec=second, console=console) == 0
        # The same chain again: recognised, reused.
        assert run_demo(settings, chunk_size=200, devnet_spec=second, console=console) == 0
    text = out.read_text()
    assert text.count("no longer match the chain") == 1, text[-3000:]
    assert "2 synced ranges no longer match the chain" in text
    assert text.count("already synced and analysed") == 1

    devnet = Devnet(settings.home)  # the second chain again, to ask the node
    info, chain = devnet.up(second)
    try:
        rpc = Rpc(info.url)
        with LiteStack(settings, workers=1) as stack:
            svc, me = stack.services, admin(stack.services)
            for start, last_hash in identities(svc, "blocks").items():
                end = start + 199
                assert last_hash == rpc.call("eth_getBlockByNumber", hex(end), False)["hash"]
            supply = {
                r["block_number"]: int(r["total_supply"])
                for r in saved_rows(svc, me, "token_supply", token=chain.token)
            }
            for b in (57, 199, 250, 399):
                assert supply[b] == rpc.eth_call(chain.token, calldata("totalSupply()"), b), b
            assert_invariants(svc)
    finally:
        devnet.down()


def tip_dag(url: str) -> str:
    """Tip following into the demo's decode and token analytics (their jobs as the demo DAG
    defines them, token_supply on its implicit one-slot pool), one window per range.

    That pool is what keeps token_supply right: each window wakes it, and a run rewrites the
    whole output from the transfers committed when it started, so two runs at once could land
    the older read last (tests/integration/test_whole_readers.py)."""
    demo = yaml.safe_load(DEMO.read_text())
    jobs: dict[str, Any] = {
        "tip": {
            "operator": "chain_tip",
            "config": {"chunk_size": 100, "safety_blocks": 3},
            "outputs": [{}],
            "worker_pool": "rpc",
        },
        "ingest": {
            "operator": "cryo_ingest",
            "config": {"datatypes": ["blocks", "logs"]},
            "inputs": [{"job": "tip"}],
            "outputs": [{}, {}],
            "worker_pool": "rpc",
        },
    }
    for name in ("transfers", "transfers_complete", "token_supply"):
        jobs[name] = demo["jobs"][name]
    jobs["transfers"]["inputs"] = [{"job": "ingest", "output": 1}]
    jobs["transfers_complete"]["config"] = {"size": 100, "origin": 0}
    dag = {
        # The platform's DAG: its saved queries read token_supply only from it (issue 38).
        "name": PLATFORM_DAG,
        "worker_pools": {"rpc": [{"env": {"RPC_URL": url}}]},
        "jobs": jobs,
        "publish": [
            {"job": "ingest", "output_index": 0, "dataset": "blocks"},
            {"job": "ingest", "output_index": 1, "dataset": "tip_logs"},
            {"job": "transfers", "output_index": 0, "dataset": "erc20_transfers"},
            {"job": "token_supply", "output_index": 0, "dataset": "token_supply"},
        ],
    }
    return yaml.safe_dump(dag, sort_keys=False)


def test_the_tip_dags_whole_dataset_analytics_never_run_two_at_once() -> None:
    """Every sql_transform of the tip DAG (woken once per window, rewriting its whole output)
    runs on a pool of one slot (its implicit `whole:` pool: dag/whole.py)."""
    spec = DagSpec.model_validate(yaml.safe_load(tip_dag("http://127.0.0.1:8545")))
    analytics = {n: j for n, j in spec.jobs.items() if j.operator == "sql_transform"}
    assert analytics
    for name, job in analytics.items():
        assert task_pool(name, job) == (implicit_pool(name), 1), name


def test_a_reorg_below_the_tip_is_replaced_and_the_analytics_follow(
    settings: Settings, dsn: str, tmp_path: Path
) -> None:
    devnet = Devnet(settings.home)  # the stack's own home's devnet: its workers may reach it
    info, chain = devnet.up(ChainSpec(seed=21, blocks=600, accounts=30, validators=3))
    rpc = Rpc(info.url)
    try:
        with LiteStack(
            settings, workers=2, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"}
        ) as stack:
            svc, me = stack.services, admin(stack.services)
            svc.control.deploy(me, tip_dag(info.url))

            def follow() -> list[dict[str, Any]]:
                tasks = finished_run(svc, svc.control.trigger(me, PLATFORM_DAG)["run_id"], 300)
                assert all(t["status"] == "succeeded" for t in tasks), [
                    (t["job"], t["last_error"]) for t in tasks if t["status"] != "succeeded"
                ]
                return tasks

            def supply_matches(blocks: list[int]) -> None:
                supply = {
                    r["block_number"]: int(r["total_supply"])
                    for r in saved_rows(svc, me, "token_supply", token=chain.token)
                }
                for b in blocks:
                    node = rpc.eth_call(chain.token, calldata("totalSupply()"), b)
                    assert supply.get(b, supply[max(k for k in supply if k <= b)]) == node, b

            follow()
            before = identities(svc, "tip_logs")
            assert 400 in before  # the range the reorg will hit was followed
            supply_matches([150, 399, 480, 499])

            # Replace the last 150 blocks (451-600): their transfers are dropped, a mint lands
            # in the new ones. The range [400, 500) now ends in another block.
            mint = {
                "from": DEPLOYER,
                "to": chain.token,
                "data": calldata("mint(address,uint256)", DEPLOYER, 10**24),
                "gas": hex(3_000_000),
            }
            rpc.call("anvil_reorg", 150, [[mint, 10]])
            reorged = rpc.call("eth_getBlockByNumber", hex(499), False)["hash"]
            assert reorged != before[400]

            tasks = follow()
            ingests = [t for t in tasks if t["job"] == "ingest"]
            assert ingests, "the reorged range was not read again"
            after = identities(svc, "tip_logs")
            assert after[400] == reorged
            assert {s: h for s, h in after.items() if s < 400} == {
                s: h for s, h in before.items() if s < 400
            }
            supply_matches([150, 399, 460, 480, 499])
            assert_invariants(svc)
    finally:
        rpc.close()
        devnet.down()
