"""The demo DAG end to end: devnet -> Cryo -> Spark decode; the decoded datasets reproduce
the chain's own state (totalSupply, balanceOf, staking views) at sampled blocks."""

from __future__ import annotations

import io
import secrets
import uuid
from typing import Any

import boto3
import polars as pl
import psycopg
import pytest
from cryptography.fernet import Fernet

from tests.support.alert_truth import check_alert_truth
from tests.support.amounts import value
from tests.support.dags import admin, finished_run
from tests.support.datasets import committed_keys
from tests.support.demo_rows import GROUP, recall, remember, run_key, spark_rows
from tests.support.devnet import DEMO, devnet_fixture, small_demo_dag
from tests.support.invariants import assert_datasets_complete, assert_invariants
from trace_platform.chain import Rpc, calldata, topic0
from trace_platform.config import Profile, Settings
from trace_platform.devnet import ChainInfo, ChainSpec
from trace_platform.devnet.big_token import LINE, MAX
from trace_platform.devnet.chain import STAKING_ADDRESS
from trace_platform.lite.demo import saved_rows
from trace_platform.lite.stack import LiteStack
from trace_platform.objectstore import make_store

pytestmark = pytest.mark.slow
SPEC = ChainSpec(seed=3, blocks=300, accounts=40, validators=4, epoch_blocks=50)


devnet = devnet_fixture(SPEC)


@pytest.fixture(scope="module")
def chain(devnet: tuple[str, ChainInfo]) -> tuple[str, str]:
    """The devnet's RPC URL and its ordinary token."""
    return devnet[0], devnet[1].token


def read_dataset(stack: LiteStack, settings: Settings, name: str) -> pl.DataFrame:
    me = admin(stack.services)
    ds = stack.services.control.show_dataset(me, name)
    store = make_store(settings)
    frames = [
        pl.read_parquet(io.BytesIO(store.get(k))) for k in committed_keys(stack.services, name)
    ]
    frame = pl.concat(frames)
    assert frame.height == ds["row_count"]
    return frame


@pytest.fixture(params=[Profile.lite, Profile.aws])
def profile_settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    """The test's settings under each profile. aws: the same Dispatcher code over SQS and S3
    (moto's, on loopback) and a real Postgres; only the adapters differ."""
    if request.param is Profile.lite:
        return settings
    endpoint = request.getfixturevalue("s3_endpoint")
    run = uuid.uuid4().hex[:10]
    bucket = f"trace-golden-{run}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ).create_bucket(Bucket=bucket)
    return Settings(
        **{
            **settings.model_dump(exclude={"queue_driver", "object_store", "sqs_create_queues"}),
            "profile": Profile.aws,
            "auth": "required",
            "operator_registry": "production",
            "internal_token": secrets.token_urlsafe(32),
            "secrets_key": Fernet.generate_key().decode(),
            "s3_bucket": bucket,
            "s3_endpoint_url": endpoint,
            "s3_access_key_id": "test",
            "s3_secret_access_key": "test",
            "sqs_endpoint_url": endpoint,
            "sqs_queue_prefix": f"g{run}-",
            "sqs_access_key_id": "test",
            "sqs_secret_access_key": "test",
        }
    )


@pytest.mark.xdist_group(GROUP)
def test_golden_path_analytics_match_the_node(
    profile_settings: Settings, dsn: str, devnet: tuple[str, ChainInfo]
) -> None:
    """The golden path (phase 7's regression harness): the demo DAG end to end, then the three
    analytics through the Query Service against the node's own views (the ordinary token and
    the large-amount one), then the invariants. Under both profiles (issue 41): the aws one's
    queues are SQS and its datasets S3, and its results equal the node's as Lite's do."""
    settings = profile_settings
    url, info = devnet
    token = info.token
    rpc = Rpc(url)
    dag = small_demo_dag(url)
    with LiteStack(
        settings, workers=2, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"}
    ) as stack:
        assert stack.services.driver.__class__.__name__ == (
            "SqsQueue" if settings.profile is Profile.aws else "PgQueue"
        )
        svc, me = stack.services, admin(stack.services)
        svc.control.deploy(me, dag, str(DEMO))
        config = {"from_block": 0, "to_block": SPEC.blocks - 1, "chunk_size": 100}
        run_id = svc.control.trigger(me, "monad_demo", config=config)["run_id"]

        tasks = finished_run(svc, run_id, 600)
        assert all(t["status"] == "succeeded" for t in tasks), [
            (t["job"], t["status"], t["last_error"]) for t in tasks if t["status"] != "succeeded"
        ]
        # test_spark_cluster compares its cluster run of the same DAG and chain with this one;
        # the aws run's Spark results equal Lite's.
        key, rows = run_key(url, dag, config), spark_rows(svc, me)
        if settings.profile is Profile.lite:
            remember(key, rows)
        elif (lite := recall(key)) is not None:
            assert rows == lite
        per_job = {j: sum(t["job"] == j for t in tasks) for j in {t["job"] for t in tasks}}
        assert per_job["ingest"] == 3 and per_job["hot"] == 4 * 3
        # The aggregators saw 3 ranges each and woke each analytic once, for the whole window.
        assert per_job["transfers_complete"] == per_job["staking_complete"] == 3
        assert per_job["token_supply"] == per_job["staking_concentration"] == 1

        # Raw data: hot window (Postgres) + cold history (Parquet) read as one, exactly once.
        head = SPEC.blocks - 1
        rows = svc.query.query(
            me, "SELECT count(*), count(DISTINCT block_number), max(block_number) FROM blocks"
        ).as_json()["rows"]
        assert rows == [[SPEC.blocks, SPEC.blocks, head]]
        hot = svc.query.query(me, "SELECT min(block_number), count(*) FROM blocks_hot")
        assert hot.as_json()["rows"] == [[head - 119, 120]]
        node_txs = sum(
            len(rpc.call("eth_getBlockByNumber", hex(b), False)["transactions"])
            for b in range(SPEC.blocks)
        )
        rows = svc.query.query(me, "SELECT count(*) FROM transactions").as_json()["rows"]
        assert rows == [[node_txs]]
        assert saved_rows(svc, me, "recent_blocks", n=3)[0]["block_number"] == head

        # Decoded amounts are exact for any uint256: 2^256-1 itself, and amounts past 10^38.
        big = info.big_token
        rows = svc.query.query(
            me,
            f"SELECT max(value), count(*) FILTER (WHERE value >= {LINE}), count(*) "
            f"FROM erc20_transfers WHERE token_address = '{big}'",
        ).as_json()["rows"]
        node_logs = rpc.call(
            "eth_getLogs", {"fromBlock": "0x0", "toBlock": hex(head), "address": big}
        )
        amounts = [int(log["data"], 16) for log in node_logs]
        assert rows == [[str(MAX), sum(a >= LINE for a in amounts), len(amounts)]]
        assert len(amounts) >= 16

        # (1) Supply by block = totalSupply() at that block.
        supply = {
            r["block_number"]: int(r["total_supply"])
            for r in saved_rows(svc, me, "token_supply", token=token)
        }
        assert len(supply) == SPEC.blocks
        assert supply[0] == 0  # before the token existed
        for b in (37, 50, 151, 222, head):
            assert supply[b] == rpc.eth_call(token, calldata("totalSupply()"), b), b

        # (2) Top holders at the tip, the truth from the node alone: every account its Transfer
        # logs name, balanceOf() each, the five largest (ties by address) = Trace's top five.
        logs = rpc.call("eth_getLogs", {"fromBlock": "0x0", "toBlock": hex(head), "address": token})
        accounts = {"0x" + t[-40:] for log in logs for t in log["topics"][1:3]} - {"0x" + "0" * 40}
        held = {a: rpc.eth_call(token, calldata("balanceOf(address)", a), head) for a in accounts}
        node_top = sorted((a for a in held if held[a] > 0), key=lambda a: (-held[a], a))[:5]
        top = saved_rows(svc, me, "top_holders", token=token, n=5)
        assert [(r["account"], int(r["balance"])) for r in top] == [(a, held[a]) for a in node_top]
        history = saved_rows(svc, me, "holder_history", token=token, n=5, every=50)
        assert {r["account"] for r in history} == {r["account"] for r in top}
        assert len(history) == 5 * (len(range(0, SPEC.blocks, 50)) + 1)
        for r in history:
            at = r["block_number"]
            if at == 0:  # before the token existed
                assert int(r["balance"]) == 0
                continue
            assert int(r["balance"]) == rpc.eth_call(
                token, calldata("balanceOf(address)", r["account"]), at
            )

        # (3) Stake per epoch, its truth from the node alone: the epochs from its EpochChanged
        # logs, every validator it counts, their stake and every delegation at each epoch's end.
        check_staking(svc, me, rpc, head)

        # Alert truth: the large-transfer rule's alerts = the node's transfers at or above it.
        check_alert_truth(svc, me, rpc, head)

        # The large-amount token, exactly: supply and every holder's balance at each block of its
        # script (and the block before), against the node.
        check_large_amount_token(svc, me, rpc, info, head)

        # A user's first DAG over the data the demo already synced (issue 44): it runs with no
        # further command, equals a direct count, and a backfill of blocks 100-199 re-runs
        # exactly the scope that holds them and leaves the result equal, twice.
        check_new_dag_over_existing_data(svc, me)

        assert_invariants(svc)
        assert_datasets_complete(svc, span=(0, SPEC.blocks))
        if settings.profile is Profile.aws:
            check_aws_adapters(settings)


def check_aws_adapters(settings: Settings) -> None:
    """The aws run's data went to S3 and its wake-ups through SQS (tasks, each buffered
    dataset's queue, delivery), nothing to a local directory or pgqueue."""
    client = {
        "endpoint_url": settings.s3_endpoint_url,
        "region_name": "us-east-1",
        "aws_access_key_id": "test",
        "aws_secret_access_key": "test",
    }
    listed = boto3.client("s3", **client).list_objects_v2(Bucket=settings.s3_bucket)
    assert listed["KeyCount"] > 0 and all(o["Key"].startswith("org/") for o in listed["Contents"])
    assert not (settings.home / "objects").exists()
    urls = boto3.client("sqs", **client).list_queues(QueueNamePrefix=settings.sqs_queue_prefix)
    names = {
        u.rsplit("/", 1)[-1].removeprefix(settings.sqs_queue_prefix) for u in urls["QueueUrls"]
    }
    assert {"tasks", "tasks-dlq", "delivery"} <= names
    assert any(n.startswith("buffer-2e") for n in names), names
    with psycopg.connect(settings.state_dsn.get_secret_value()) as conn:  # type: ignore[union-attr]
        assert conn.execute("SELECT count(*) FROM queue_messages").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone() == (0,)


TX_WINDOWS = """
name: tx_windows
jobs:
  count:
    operator: sql_transform
    inputs: [{from: {dataset: transactions}}]
    outputs: [{backend: parquet}]
    config:
      sql: |
        SELECT CAST(floor(block_number / 100) * 100 AS BIGINT) AS window_start,
               count(*) AS txs
        FROM transactions GROUP BY 1
publish:
  - {job: count, output_index: 0, dataset: tx_per_100_blocks}
"""


def check_new_dag_over_existing_data(svc: Any, me: Any) -> None:
    direct = query_rows(
        svc,
        me,
        "SELECT CAST(floor(block_number / 100) * 100 AS BIGINT) AS window_start, "
        "count(*) AS txs FROM transactions GROUP BY 1 ORDER BY 1",
    )
    res = svc.control.deploy(me, TX_WINDOWS)
    assert res.live and res.replays["count"].sources == {"transactions": 3}
    finished_run(svc, res.replays["count"].run_id, 300)
    windows = "SELECT window_start, txs FROM tx_per_100_blocks ORDER BY 1"
    assert query_rows(svc, me, windows) == direct and len(direct) == 3
    for _ in range(2):
        plan = svc.control.changes.backfill(me, "tx_windows", from_block=100, to_block=199)
        assert plan["jobs"]["count"]["scopes"] == ["range:100-200"]
        tasks = finished_run(svc, plan["run_id"], 300)
        assert [t["status"] for t in tasks] == ["succeeded"]
        assert query_rows(svc, me, windows) == direct


def check_staking(svc: Any, me: Any, rpc: Rpc, head: int) -> None:
    """validator_stake, staking_concentration, delegator_stake and delegator_concentration per
    epoch, against the staking contract's views at each epoch's last block."""
    changes = rpc.call(
        "eth_getLogs",
        {
            "fromBlock": "0x0",
            "toBlock": hex(head),
            "address": STAKING_ADDRESS,
            "topics": [topic0("EpochChanged(uint64,uint64)")],
        },
    )
    starts = [(int(c["data"][66:130], 16), int(c["blockNumber"], 16)) for c in changes]
    assert len(starts) >= 4
    if starts[0][1] > 0:  # the epoch in force at block 0
        starts.insert(0, (starts[0][0] - 1, 0))
    periods = [
        (epoch, first, (starts[i + 1][1] - 1) if i + 1 < len(starts) else head)
        for i, (epoch, first) in enumerate(starts)
    ]
    got = [
        (r["epoch"], r["first_block"], r["last_block"])
        for r in query_rows(svc, me, "SELECT * FROM staking_periods ORDER BY first_block")
    ]
    assert got == periods  # epochs as the node has them, the last one clipped to the synced head
    validators = range(1, rpc.eth_call(STAKING_ADDRESS, calldata("validatorCount()"), head) + 1)
    delegates = rpc.call(
        "eth_getLogs",
        {
            "fromBlock": "0x0",
            "toBlock": hex(head),
            "address": STAKING_ADDRESS,
            "topics": [topic0("Delegate(uint64,address,uint256,uint64)")],
        },
    )
    pairs = {(int(d["topics"][1], 16), "0x" + d["topics"][2][-40:]) for d in delegates}
    stake_rows = query_rows(svc, me, "SELECT * FROM validator_stake")
    stakes = {(r["window_end"], r["validator_id"]): int(r["stake"]) for r in stake_rows}
    deleg = {
        (r["window_end"], r["validator_id"], r["delegator"]): int(r["stake"])
        for r in query_rows(svc, me, "SELECT * FROM delegator_stake")
    }
    conc = {r["window_end"]: r for r in saved_rows(svc, me, "staking_concentration")}
    dconc = {
        (r["window_end"], r["validator_id"]): r
        for r in query_rows(svc, me, "SELECT * FROM delegator_concentration")
    }
    want_deleg: dict[tuple[int, int, str], int] = {}
    for epoch, _, end in periods:
        node = {
            v: rpc.eth_call(STAKING_ADDRESS, calldata("validatorStake(uint64)", v), end)
            for v in validators
        }
        assert {v: stakes.get((end, v), 0) for v in validators} == node, end
        positive = sorted((s for s in node.values() if s > 0), reverse=True)
        total = sum(positive)
        shares = [s / total for s in positive]
        assert conc[end]["epoch"] == epoch
        assert conc[end]["hhi"] == pytest.approx(round(sum(x * x for x in shares), 4), abs=1e-4)
        needed, larger = 0, 0  # exactly: each validator is needed while 3 x larger <= total
        for s in positive:
            if 3 * larger > total:
                break
            needed, larger = needed + 1, larger + s
        assert conc[end]["nakamoto_coefficient"] == needed
        for v, who in pairs:
            held = rpc.eth_call(
                STAKING_ADDRESS, calldata("delegation(uint64,address)", v, who), end
            )
            if held:
                want_deleg[(end, v, who)] = held
        for v in validators:
            held = {w: s for (e, vv, w), s in want_deleg.items() if (e, vv) == (end, v)}
            if not held:
                assert (end, v) not in dconc
                continue
            r, total_v = dconc[(end, v)], sum(held.values())
            assert (r["delegators"], int(r["total_stake"])) == (len(held), total_v)
            assert r["top_delegator"] == max(held, key=lambda w: (held[w], w))
            assert r["hhi"] == pytest.approx(sum((s / total_v) ** 2 for s in held.values()))
    assert deleg == want_deleg


def query_rows(svc: Any, me: Any, sql: str) -> list[dict[str, Any]]:
    out = svc.query.query(me, sql).as_json()
    cols = [c["name"] for c in out["columns"]]
    return [dict(zip(cols, row, strict=True)) for row in out["rows"]]


def check_large_amount_token(svc: Any, me: Any, rpc: Rpc, info: ChainInfo, head: int) -> None:
    big = info.big_token
    logs = rpc.call("eth_getLogs", {"fromBlock": "0x0", "toBlock": hex(head), "address": big})
    blocks = sorted({int(log["blockNumber"], 16) + d for log in logs for d in (-1, 0)} | {head})
    supply = {
        r["block_number"]: int(r["total_supply"])
        for r in saved_rows(svc, me, "token_supply", token=big)
    }
    for b in blocks:
        assert supply[b] == rpc.eth_call(big, calldata("totalSupply()"), b), b
    assert max(supply.values()) == MAX  # the script mints 2^256-1 onto an empty supply
    changes = svc.query.query(
        me,
        "SELECT account, block_number, balance FROM token_balances "
        f"WHERE token_address = '{big}' ORDER BY account, block_number",
    ).as_json()["rows"]
    assert {a for a, _, _ in changes} == set(info.big_holders)
    for holder in info.big_holders:
        history = [(b, int(v)) for a, b, v in changes if a == holder]
        for b in blocks:
            ours = next((v for at, v in reversed(history) if at <= b), 0)
            node = rpc.eth_call(big, calldata("balanceOf(address)", holder), b)
            assert ours == node, (holder, b)
    top = saved_rows(svc, me, "top_holders", token=big, n=4)
    assert top and all(
        int(r["balance"]) == rpc.eth_call(big, calldata("balanceOf(address)", r["account"]), head)
        for r in top
    )


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
    config: {token_address: "TOKEN"}
    inputs: [{job: ingest}]
    outputs: [{}]
  supply:
    operator: sql_transform
    config:
      sql: >
        SELECT block_number, u256_sum(u256_sum(CASE
        WHEN from_address = '0x0000000000000000000000000000000000000000' THEN value
        WHEN to_address = '0x0000000000000000000000000000000000000000' THEN u256_neg(value)
        ELSE u256(0) END)) OVER (ORDER BY block_number) AS total_supply
        FROM input_0 GROUP BY block_number
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
        svc.control.deploy(me, SQL_DAG.replace("RPC_ENDPOINT", url).replace("TOKEN", token))
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
            # Read from the files: the amount as stored (limbs).
            assert rpc.eth_call(token, calldata("totalSupply()"), row["block_number"]) == value(
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
            assert all(t["status"] == "succeeded" for t in tasks), [
                (t["job"], t["status"], t["last_error"])
                for t in tasks
                if t["status"] != "succeeded"
            ]
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
