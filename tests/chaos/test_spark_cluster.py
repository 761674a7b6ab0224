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

from tests.support.dags import admin, dag_probe, finished_run
from tests.support.datasets import committed_keys
from tests.support.demo_rows import GROUP, SPARK_DATASETS, recall, run_key, spark_rows
from tests.support.devnet import DEMO, devnet_fixture, small_demo_dag
from tests.support.invariants import assert_invariants
from tests.support.spark_cluster import SparkCluster
from trace_platform.config import ObjectStoreBackend, Settings
from trace_platform.devnet import ChainInfo, ChainSpec
from trace_platform.lite.stack import LiteStack
from trace_platform.objectstore import make_store
from trace_platform.objectstore.committed import read_manifest

pytestmark = pytest.mark.slow
SPEC = ChainSpec(seed=3, blocks=300, accounts=40, validators=4, epoch_blocks=50)
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


def config() -> dict[str, int]:
    return {"from_block": 0, "to_block": SPEC.blocks - 1, "chunk_size": 100}


def run_demo(stack: LiteStack, url: str) -> dict[str, list[Any]]:
    """The demo DAG over the whole chain; every Spark-made dataset's rows, in a fixed order."""
    svc, me = stack.services, admin(stack.services)
    svc.control.deploy(me, small_demo_dag(url), str(DEMO))
    run_id = svc.control.trigger(me, "monad_demo", config=config())["run_id"]
    tasks = finished_run(svc, run_id, 900)
    assert all(t["status"] == "succeeded" for t in tasks), [
        (t["job"], t["status"], t["last_error"]) for t in tasks if t["status"] != "succeeded"
    ]
    return spark_rows(svc, me)


@pytest.mark.xdist_group(GROUP)
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
    # The local run: test_monad_demo's golden path's when it ran the same DAG over the same
    # chain in this process (tests/support/demo_rows.py), else this test's own.
    local = recall(run_key(url, small_demo_dag(url), config()))
    if local is None:
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
            assert cluster.executors() == 2  # both workers' executors joined the application
            # The decoded ranges were written by the executors: their committed files are in
            # S3 (no local staging), as the Spark job's manifest lists them.
            store = make_store(remote)
            for name in ("erc20_transfers", "staking_events", "token_supply"):
                keys = committed_keys(stack.services, name)
                prefixes = {k.rsplit("/", 1)[0] + "/" for k in keys}
                manifests = [read_manifest(store, p) for p in prefixes]
                assert sorted(f["key"] for m in manifests for f in m) == sorted(keys), name
            assert_invariants(stack.services)
            other_operators_keep_their_spark_in_the_sandbox(stack)
    for name in SPARK_DATASETS:
        assert on_cluster[name] == local[name], name


def other_operators_keep_their_spark_in_the_sandbox(stack: LiteStack) -> None:
    """Only CLUSTER_OPERATORS reach the cluster (its executors hold the store credentials): any
    other operator's Spark is the host's own local JVM, even with an sc:// master."""
    probe = "jobs:\n  look:\n    operator: probe\n    max_attempts: 1\n"
    report = dag_probe(
        stack,
        admin(stack.services),
        "probe_dag",
        probe + "    config: {spark_sql: [SET spark.master]}\n",
    )
    assert report["spark"]["SET spark.master"] == "ALLOWED: [('spark.master', 'local[1]')]", report
