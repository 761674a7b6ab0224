"""alert_evaluate against a real Postgres and a real Spark (issue 40): rules are guarded SELECTs
over the job's inputs; what they return lands, through the attempt's fenced buffer publish and
the trusted sink, in the org's one shared `alert_events`, each alert once; the org's alert
datasets are the platform's, their writers exactly the org's jobs that run the operator."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trace_platform.spark as tspark
from tests.support.amounts import ARROW_LIMBS, limbs
from tests.support.dags import admin
from trace_platform.contract import (
    BufferPublishRequest,
    ClaimRequest,
    CommittedScope,
    DatasetRef,
    TaskPayload,
)
from trace_platform.dag.validate import DagInvalid
from trace_platform.objectstore import make_store
from trace_platform.operators.alert_evaluate import alert_evaluate
from trace_platform.operators.context import OperatorContext, PermanentError
from trace_platform.services import Services
from trace_platform.sink.service import Sink

pytest.importorskip("pyspark")

BIG = 2**255 + 7
RULES = """
      - name: large_transfer
        sql: >-
          SELECT block_time AS event_time,
                 CASE WHEN value >= u256(:critical) THEN 'critical' ELSE 'warning' END
                   AS severity,
                 concat(tx_hash, ':', log_index) AS dedupe_key,
                 named_struct('tx_hash', tx_hash, 'value', value) AS payload
          FROM transfers WHERE value >= u256(:threshold)
        args: {threshold: '1000', critical: '57896044618658097711785492504343953926634992332820282019728792003956564819968'}
      - name: any_block
        sql: SELECT max(block_number) AS block, 1700000000 AS event_time, 'info' AS severity,
               'seen' AS dedupe_key FROM transfers
"""
DAG = f"""
name: watch
jobs:
  rules:
    operator: alert_evaluate
    config:
      rules:
{RULES}
"""


def _dag(name: str, job: str = "rules") -> str:
    rule = "SELECT 1 AS event_time, 'info' AS severity, 'k' AS dedupe_key"
    return (
        f"name: {name}\njobs:\n  {job}:\n    operator: alert_evaluate\n"
        f'    config: {{rules: [{{name: r, sql: "{rule}"}}]}}\n'
    )


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    yield tspark.get_spark()


def _alert_datasets(s: Services) -> dict[str, dict[str, Any]]:
    with s.pool.connection() as conn:
        rows = conn.execute(
            "SELECT name, platform, writers, table_name FROM buffered_datasets"
        ).fetchall()
    return {r["name"]: r for r in rows}


def test_the_orgs_alert_events_belongs_to_the_platform_and_its_writers_follow_deploys(
    services: Services,
) -> None:
    s, me = services, admin(services)
    s.control.deploy(me, _dag("one"))
    s.control.deploy(me, _dag("two", "check"))
    ds = _alert_datasets(s)["alert_events"]
    assert ds["platform"] == "alert_events"
    assert ds["writers"] == ["one.rules", "two.check"]
    # A redeploy without the job takes its writer away; the other DAG's stays.
    s.control.deploy(me, "name: one\njobs:\n  other:\n    operator: noop\n")
    assert _alert_datasets(s)["alert_events"]["writers"] == ["two.check"]
    assert "alert_deliveries" not in _alert_datasets(s)  # no alert_route job yet


def test_a_dag_declared_alert_events_is_not_the_platforms(services: Services) -> None:
    s, me = services, admin(services)
    s.control.deploy(
        me,
        "name: own\njobs:\n  w: {operator: noop, buffer_outputs: [alert_events]}\n"
        "buffered:\n  - {name: alert_events, columns: [{name: k, type: text}],"
        " unique_key: [k], writers: [own.w]}\n",
    )
    with pytest.raises(DagInvalid, match="a DAG declares a buffered dataset of that name"):
        s.control.deploy(me, _dag("watch"))


def _transfers(store: Any, prefix: str) -> str:
    table = pa.table(
        {
            "block_number": pa.array([10, 11, 12, 12], pa.int64()),
            "block_time": pa.array(
                [1_700_000_010, 1_700_000_011, 1_700_000_012, 1_700_000_012], pa.int64()
            ).cast(pa.timestamp("s", tz="UTC")),
            "tx_hash": ["0xa", "0xb", "0xc", "0xd"],
            "log_index": pa.array([0, 3, 1, 2], pa.int64()),
            "value": pa.array([limbs(999), limbs(1000), limbs(BIG), limbs(5)], ARROW_LIMBS),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.put(f"{prefix}part-00000.parquet", buf.getvalue())
    return prefix


def _dag_id(s: Services) -> UUID:
    with s.pool.connection() as conn:
        return conn.execute("SELECT dag_id FROM dags WHERE name = 'watch'").fetchone()["dag_id"]


def _run(s: Services, tmp: Path, config: dict[str, Any]) -> list[dict[str, Any]]:
    """The rules job's task claimed, its operator run in-process over a transfers input (as
    its host would), and every buffer publish it asks for made as the wrapper makes it."""
    me = admin(s)
    (task_id,) = s.control.trigger(me, "watch")["tasks"]
    c = s.dispatcher.claim(ClaimRequest(task_id=UUID(str(task_id)), worker_id="w"))
    store = make_store(s.settings)
    store.ensure_bucket()
    loc = _transfers(store, f"test/{uuid4().hex}/")
    ref = DatasetRef(
        dataset_uuid=uuid4(), dataset_version=uuid4(), dataset_name="transfers", location=loc
    )
    task = TaskPayload.model_construct(
        task_id=c.task_id,
        attempt=c.attempt,
        org_id=me.org_id,
        dag_id=_dag_id(s),
        job="rules",
        operator="alert_evaluate",
        config=config,
        inputs=[ref],
        outputs=[],
        committed=[
            CommittedScope(
                dataset_uuid=ref.dataset_uuid,
                dataset_version=ref.dataset_version,
                scope="all",
                location=loc,
            )
        ],
        input_event=None,
    )
    sent: list[dict[str, Any]] = []
    ctx = OperatorContext(task=task, workdir=tmp, _send=sent.append, _store=store)
    try:
        alert_evaluate(ctx)
    finally:
        ctx.close()
    for m in sent:
        if m["type"] == "buffer":
            s.dispatcher.buffers.publish(
                BufferPublishRequest(
                    task_id=c.task_id,
                    attempt=c.attempt,
                    lease_token=c.lease_token,
                    **m["buffer"],
                )
            )
    s.publisher.drain()
    Sink(s.dispatcher, s.driver, store, s.data_dsn).drain()
    table = _alert_datasets(s)["alert_events"]["table_name"]
    schema, _, name = table.partition(".")
    with s.pool.connection() as conn:
        return conn.execute(
            psycopg.sql.SQL(
                "SELECT rule, dedupe_key, severity, event_time, payload, job, org_id FROM {}"
                " ORDER BY rule, dedupe_key"
            ).format(psycopg.sql.Identifier(schema, name))
        ).fetchall()


def test_rules_raise_alerts_into_alert_events_each_once(
    services: Services, spark: Any, tmp_path: Path
) -> None:
    import yaml

    s = services
    s.control.deploy(admin(s), DAG)
    config = yaml.safe_load(DAG)["jobs"]["rules"]["config"]
    rows = _run(s, tmp_path / "a", config)
    got = [(r["rule"], r["dedupe_key"], r["severity"]) for r in rows]
    assert got == [
        ("any_block", "seen", "info"),
        ("large_transfer", "0xb:3", "warning"),
        ("large_transfer", "0xc:1", "critical"),
    ]
    big = rows[2]
    assert big["payload"] == {"tx_hash": "0xc", "value": str(BIG)}  # exact, as decimal text
    assert big["event_time"].timestamp() == 1_700_000_012  # the block's time, not now
    assert rows[0]["payload"] == {"block": 12}  # no payload column: the other columns
    assert {r["org_id"] for r in rows} == {admin(s).org_id}
    # A rerun over the same data raises the same alerts: stored once.
    again = _run(s, tmp_path / "b", config)
    assert [(r["rule"], r["dedupe_key"]) for r in again] == [(r[0], r[1]) for r in got]


@pytest.mark.parametrize(
    ("sql", "refused"),
    [
        ("SELECT 1 AS event_time, 'info' AS severity FROM transfers", "no dedupe_key"),
        ("SELECT 1 AS event_time, 'loud' AS severity, 'k' AS dedupe_key", "severity 'loud'"),
        ("SELECT 'x' AS event_time, 'info' AS severity, 'k' AS dedupe_key", "event_time 'x'"),
        ("SELECT reflect('java.lang.System', 'exit', 1) AS x", "refuses"),
    ],
)
def test_a_bad_rule_fails_the_task_naming_the_rule(
    services: Services, spark: Any, tmp_path: Path, sql: str, refused: str
) -> None:
    s = services
    s.control.deploy(admin(s), DAG)
    with pytest.raises(PermanentError, match=f"rule 'bad'.*{refused}|{refused}"):
        _run(s, tmp_path, {"rules": [{"name": "bad", "sql": sql}]})


def test_a_rules_args_may_not_name_a_synced_block(
    services: Services, spark: Any, tmp_path: Path
) -> None:
    """As in sql_transform: `:<view>_first_block` / `_last_block` are what the data holds,
    not the config's to say."""
    s = services
    s.control.deploy(admin(s), DAG)
    rule = {
        "name": "bad",
        "sql": "SELECT 1 AS event_time, 'info' AS severity, 'k' AS dedupe_key"
        " FROM transfers WHERE block_number >= :transfers_first_block",
        "args": {"transfers_first_block": 0},
    }
    with pytest.raises(PermanentError, match="rule 'bad' args: transfers_first_block: set by"):
        _run(s, tmp_path, {"rules": [rule]})
