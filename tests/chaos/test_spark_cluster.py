"""The demo's decode and analytics jobs on a real Spark standalone cluster (a master and two
workers, each its own JVM, and a Spark Connect server as the cluster's driver), reading and
writing moto's S3 from the executors, through sandboxed operator hosts: every decoded and
analytic dataset equals the one a `local[*]` run of the same DAG on the same chain produced."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.dags import admin, dag_probe, finished_run, user
from tests.support.datasets import committed_keys
from tests.support.devnet import DEMO, devnet_fixture, small_demo_dag
from tests.support.invariants import assert_invariants
from tests.support.spark_cluster import SparkCluster
from trace_platform.config import ObjectStoreBackend, Settings
from trace_platform.devnet import ChainInfo, ChainSpec
from trace_platform.lite.stack import LiteStack

pytestmark = pytest.mark.slow
SPEC = ChainSpec(seed=3, blocks=300, accounts=40, validators=4, epoch_blocks=50)
SPARK_DATASETS = (
    "erc20_transfers",
    "staking_events",
    "token_supply",
    "token_balances",
    "staking_periods",
    "validator_stake",
    "staking_concentration",
    "delegator_stake",
)
BUCKET = "trace-cluster"

devnet = devnet_fixture(SPEC)


@pytest.fixture
def second_dsn(pg_server: str, template_db: str) -> Iterator[str]:
    name = "t_cluster_run"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_db)
            )
        )
    yield psycopg.conninfo.make_conninfo(pg_server, dbname=name)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def run_demo(stack: LiteStack, url: str) -> dict[str, list[Any]]:
    """The demo DAG over the whole chain; every Spark-made dataset's rows, in a fixed order."""
    svc, me = stack.services, admin(stack.services)
    svc.control.deploy(me, small_demo_dag(url), str(DEMO))
    run_id = svc.control.trigger(
        me, "monad_demo", config={"from_block": 0, "to_block": SPEC.blocks - 1, "chunk_size": 100}
    )["run_id"]
    tasks = finished_run(svc, run_id, 900)
    assert all(t["status"] == "succeeded" for t in tasks), [
        (t["job"], t["status"], t["last_error"]) for t in tasks if t["status"] != "succeeded"
    ]
    out = {}
    for name in SPARK_DATASETS:
        rows = svc.query.query(me, f"SELECT * FROM {name}").as_json()["rows"]
        out[name] = sorted(rows, key=repr)
    return out


def test_decode_and_analytics_on_a_standalone_cluster_equal_local(
    settings: Settings,
    dsn: str,
    second_dsn: str,
    s3_endpoint: str,
    devnet: tuple[str, ChainInfo],
    tmp_path: Path,
) -> None:
    url, _ = devnet
    env = {"TRACE_QUEUE_POLL_SECONDS": "0.2"}
    with LiteStack(settings, workers=2, dsn=dsn, worker_env=env) as stack:
        local = run_demo(stack, url)
    assert local["erc20_transfers"] and local["staking_events"] and local["token_supply"]

    s3 = {
        "TRACE_OBJECT_STORE": "s3",
        "TRACE_S3_BUCKET": BUCKET,
        "TRACE_S3_ENDPOINT_URL": s3_endpoint,
        "TRACE_S3_REGION": "us-east-1",
        "TRACE_S3_ACCESS_KEY_ID": "test",
        "TRACE_S3_SECRET_ACCESS_KEY": "test",
    }
    with SparkCluster(tmp_path / "spark", s3, workers=2) as cluster:
        remote = Settings(
            **{
                k: getattr(settings, k)
                for k in (
                    "auth",
                    "lease_seconds",
                    "heartbeat_seconds",
                    "retry_backoff_seconds",
                    "retry_backoff_max_seconds",
                    "reaper_interval_seconds",
                    "queue_poll_seconds",
                )
            },
            state_dsn=second_dsn,
            home=tmp_path / "cluster-home",
            object_store=ObjectStoreBackend.s3,
            s3_bucket=BUCKET,
            s3_endpoint_url=s3_endpoint,
            s3_access_key_id="test",
            s3_secret_access_key="test",
            spark_master=cluster.remote,
        )
        worker_env = {**env, **s3, "TRACE_SPARK_MASTER": cluster.remote}
        with LiteStack(remote, workers=2, dsn=second_dsn, worker_env=worker_env) as stack:
            on_cluster = run_demo(stack, url)
            assert cluster.executors() == 2  # both workers' executors served the application
            # The decoded ranges were written by the executors: their committed files are in
            # S3 (no local staging), as the Spark job's manifest lists them.
            keys = committed_keys(stack.services, "erc20_transfers")
            assert keys and all(k.endswith(".parquet") for k in keys)
            assert_invariants(stack.services)
            one_tenant_leaves_nothing_on_the_cluster_for_the_next(stack)
    for name in SPARK_DATASETS:
        assert on_cluster[name] == local[name], name


def one_tenant_leaves_nothing_on_the_cluster_for_the_next(stack: LiteStack) -> None:
    """Each task is a Connect session of its own, and what sessions share on the server is
    dropped when a task ends: another tenant's next task sees none of it."""
    svc = stack.services
    alice, _ = user(svc, "alice")
    bob, _ = user(svc, "bob")
    body = "jobs:\n  leave:\n    operator: leave_traces\n    max_attempts: 1\n"
    left = dag_probe(
        stack, alice, "alice_dag", body + "    config: {value: alice-7, spark: true}\n"
    )
    assert left["status"] == "succeeded", left
    queries = [
        "SELECT * FROM global_temp.left_behind",
        "SELECT * FROM left_behind",
        "SELECT left_behind_fn()",
    ]
    probe = "jobs:\n  look:\n    operator: probe\n    max_attempts: 1\n"
    report = dag_probe(stack, bob, "bob_dag", probe + f"    config: {{spark_sql: {queries}}}\n")
    assert set(report["spark"]) == set(queries), report
    for q in queries:
        assert report["spark"][q].startswith("refused"), report["spark"]
