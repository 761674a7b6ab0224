"""The demo DAG end to end: devnet -> Cryo -> Spark decode; the decoded datasets reproduce
the chain's own state (totalSupply, balanceOf, staking views) at sampled blocks."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from tests.support.dags import admin, finished_run
from tests.support.invariants import assert_invariants
from trace_platform.config import Settings
from trace_platform.devnet import ChainSpec, Devnet
from trace_platform.devnet.chain import STAKING_ADDRESS
from trace_platform.devnet.rpc import Rpc, calldata
from trace_platform.lite.stack import LiteStack
from trace_platform.objectstore import list_all, make_store

pytestmark = pytest.mark.slow
SPEC = ChainSpec(seed=3, blocks=300, accounts=40, validators=4, epoch_blocks=50)
DEMO = Path(__file__).resolve().parents[2] / "examples" / "dags" / "monad_demo.yaml"
ZERO = "0x" + "0" * 40


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    d = Devnet(tmp_path_factory.mktemp("devnet"))
    info, c = d.up(SPEC)
    yield info.url, c.token
    d.down()


def read_dataset(stack: LiteStack, settings: Settings, name: str) -> pl.DataFrame:
    me = admin(stack.services)
    ds = stack.services.control.show_dataset(me, name)
    store = make_store(settings)
    prefix = f"org/{me.org_id}/dataset/{ds['dataset_uuid']}/version/{ds['current_version']}/"
    frames = [pl.read_parquet(io.BytesIO(store.get(o.key))) for o in list_all(store, prefix)]
    frame = pl.concat(frames)
    assert frame.height == ds["row_count"]
    return frame


def test_demo_dag_decodes_exactly(settings: Settings, dsn: str, chain: tuple[str, str]) -> None:
    url, token = chain
    rpc = Rpc(url)
    with LiteStack(
        settings, workers=2, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"}
    ) as stack:
        svc, me = stack.services, admin(stack.services)
        svc.control.deploy(me, DEMO.read_text().replace("http://127.0.0.1:8545", url), str(DEMO))
        run_id = svc.control.trigger(
            me,
            "monad_demo",
            config={"from_block": 0, "to_block": SPEC.blocks - 1, "chunk_size": 100},
        )["run_id"]

        tasks = finished_run(svc, run_id, 400)
        assert len(tasks) == 1 + 3 * 3
        assert all(t["status"] == "succeeded" for t in tasks), [t["last_error"] for t in tasks]

        transfers = read_dataset(stack, settings, "erc20_transfers")
        assert not transfers["value_overflow"].any()
        assert transfers.select(
            (pl.col("value").cast(pl.Utf8) == pl.col("value_text")).all()
        ).item()
        for at in (50, 150, SPEC.blocks - 1):
            upto = transfers.filter(pl.col("block_number") <= at)
            supply = sum(
                int(v) for v in upto.filter(pl.col("from_address") == ZERO)["value_text"]
            ) - sum(int(v) for v in upto.filter(pl.col("to_address") == ZERO)["value_text"])
            assert rpc.eth_call(token, calldata("totalSupply()"), at) == supply
            holders = sorted(set(upto["to_address"].to_list()) - {ZERO})[:5]
            for h in holders:
                flow = sum(
                    int(v) for v in upto.filter(pl.col("to_address") == h)["value_text"]
                ) - sum(int(v) for v in upto.filter(pl.col("from_address") == h)["value_text"])
                assert rpc.eth_call(token, calldata("balanceOf(address)", h), at) == flow

        staking = read_dataset(stack, settings, "staking_events")
        assert {"ValidatorCreated", "Delegate", "EpochChanged"} <= set(staking["event"].to_list())
        stake: dict[tuple[int, str], int] = {}
        for row in staking.filter(pl.col("event").is_in(["Delegate", "Undelegate"])).iter_rows(
            named=True
        ):
            key = (row["validator_id"], row["delegator"])
            stake[key] = stake.get(key, 0) + int(row["amount_delta_text"])
        for (validator, delegator), amount in list(stake.items())[:10]:
            view = rpc.eth_call(
                STAKING_ADDRESS,
                calldata("delegation(uint64,address)", validator, delegator),
                SPEC.blocks - 1,
            )
            assert view == amount
        epochs = staking.filter(pl.col("event") == "EpochChanged")["epoch"].to_list()
        assert epochs == sorted(epochs) and epochs[0] == 1
        assert_invariants(svc)


SQL_DAG = """
name: supply_check
worker_pools:
  rpc: [{env: {RPC_URL: "RPC_ENDPOINT"}}]
jobs:
  backfill:
    operator: range_splitter
    config: {from_block: 0, to_block: 299, chunk_size: 1000}
    outputs: [{}]
  ingest:
    operator: cryo_ingest
    config: {datatypes: [logs]}
    inputs: [{job: backfill}]
    outputs: [{}]
    worker_pool: rpc
  transfers:
    operator: decode_erc20_transfers
    inputs: [{job: ingest}]
    outputs: [{}]
  supply:
    operator: sql_transform
    config:
      sql: >
        SELECT block_number, SUM(SUM(CASE WHEN from_address = '0x0000000000000000000000000000000000000000'
        THEN value WHEN to_address = '0x0000000000000000000000000000000000000000' THEN -value ELSE 0 END))
        OVER (ORDER BY block_number) AS total_supply FROM input_0 GROUP BY block_number
    inputs: [{job: transfers}]
    outputs: [{}]
  broken:
    operator: sql_transform
    config: {sql: "SELECT no_such_column FROM input_0"}
    inputs: [{job: transfers}]
    outputs: [{}]
publish:
  - {job: supply, output_index: 0, dataset: supply_check}
"""


def test_sql_transform_and_spark_errors(
    settings: Settings, dsn: str, chain: tuple[str, str]
) -> None:
    url, token = chain
    rpc = Rpc(url)
    with LiteStack(
        settings, workers=1, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"}
    ) as stack:
        svc, me = stack.services, admin(stack.services)
        svc.control.deploy(me, SQL_DAG.replace("RPC_ENDPOINT", url))
        run_id = svc.control.trigger(me, "supply_check")["run_id"]

        tasks = {t["job"]: t for t in finished_run(svc, run_id)}
        assert len(tasks) == 5, {j: t["last_error"] for j, t in tasks.items()}
        assert tasks["supply"]["status"] == "succeeded", tasks["supply"]["last_error"]
        broken = tasks["broken"]
        assert broken["status"] == "failed" and broken["attempt"] == 1  # no retry for bad SQL
        assert "Spark SQL" in broken["last_error"] and "no_such_column" in broken["last_error"]
        assert "\tat " not in broken["last_error"]  # the useful lines, not the Java stack
        supply = read_dataset(stack, settings, "supply_check").sort("block_number")
        for row in supply.sample(n=min(10, supply.height), seed=1).iter_rows(named=True):
            assert rpc.eth_call(token, calldata("totalSupply()"), row["block_number"]) == int(
                row["total_supply"]
            )


TIP_DAG = """
name: tip
worker_pools:
  rpc: [{env: {RPC_URL: "RPC_ENDPOINT"}}]
jobs:
  tip:
    operator: chain_tip
    config: {chunk_size: 100, safety_blocks: 3}
    outputs: [{}]
    worker_pool: rpc
  ingest:
    operator: cryo_ingest
    config: {datatypes: [logs]}
    inputs: [{job: tip}]
    outputs: [{}]
    worker_pool: rpc
publish:
  - {job: ingest, output_index: 0, dataset: tip_logs}
"""


def test_tip_following_emits_each_whole_range_once(
    settings: Settings, dsn: str, chain: tuple[str, str]
) -> None:
    """Runs last in this module: it mines more blocks on the shared devnet."""
    url, _ = chain
    rpc = Rpc(url)
    with LiteStack(
        settings, workers=1, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"}
    ) as stack:
        svc, me = stack.services, admin(stack.services)
        svc.control.deploy(me, TIP_DAG.replace("RPC_ENDPOINT", url))

        def run_once() -> list[dict[str, object]]:
            tasks = finished_run(svc, svc.control.trigger(me, "tip")["run_id"], 120)
            assert all(t["status"] == "succeeded" for t in tasks), [t["last_error"] for t in tasks]
            return [t for t in tasks if t["job"] == "ingest"]

        def safe_head() -> int:  # the node's finalized block (anvil's lags its head), less safety
            return int(rpc.call("eth_getBlockByNumber", "finalized", False)["number"], 16) - 3

        assert len(run_once()) == (safe_head() + 1) // 100  # whole chunks only
        assert run_once() == []  # nothing new: nothing emitted
        for _ in range(150):
            rpc.call("evm_mine")
        run_once()
        with svc.pool.connection() as conn:
            scopes = [
                r["scope"]
                for r in conn.execute(
                    """SELECT c.scope FROM dataset_commits c JOIN datasets d USING (dataset_uuid)
                       WHERE d.dataset_name = 'tip_logs' ORDER BY c.range_start"""
                ).fetchall()
            ]
        expected = [f"range:{s}-{s + 100}" for s in range(0, ((safe_head() + 1) // 100) * 100, 100)]
        assert len(expected) >= 3  # the third run did follow the tip
        assert scopes == expected
        assert_invariants(svc)
