"""Immutable files under readers, on real Postgres, real files, real Spark and DuckDB: every
attempt writes its own keys, a commit swaps a scope's location and retires the old one, a query
pinned before a replay reads the old files to the end, the collector deletes only what nothing
can reach, readers follow commits (never every attempt's files under a range), and an append
output with a unique_key never repeats a key across replays and overlapping ranges."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trace_platform.spark as tspark
from tests.support.dags import admin
from tests.support.wait import wait_for
from trace_platform.chain import topic0
from trace_platform.contract import (
    ClaimRequest,
    CompleteRequest,
    EventIn,
    LeaseRef,
    OutputCommit,
    RangeSpec,
    TaskPayload,
)
from trace_platform.db.pool import sink_dsn
from trace_platform.errors import Conflict
from trace_platform.objectstore import ObjectStore, list_all, make_store
from trace_platform.operators.context import OperatorContext
from trace_platform.operators.decode import decode_erc20_transfers
from trace_platform.operators.hot_window import hot_window
from trace_platform.operators.output import attempt_prefix, range_prefix
from trace_platform.registry.collector import Collector
from trace_platform.services import Services

DAG = """
name: imm
jobs:
  ingest:
    operator: noop
    outputs: [{backend: parquet}]
  transfers:
    operator: decode_erc20_transfers
    inputs: [{job: ingest, output: 0}]
    outputs:
      - {backend: parquet, update_strategy: append, unique_key: [tx_hash, log_index]}
  hot:
    operator: hot_window
    config: {window_blocks: 1000}
    inputs: [{job: ingest, output: 0}]
    outputs: [{backend: postgres}]
publish:
  - {job: ingest, output_index: 0, dataset: logs}
  - {job: transfers, output_index: 0, dataset: erc20_transfers}
  - {job: hot, output_index: 0, dataset: logs_hot, hot_window: {of: logs}}
"""

TRANSFER = bytes.fromhex(topic0("Transfer(address,address,uint256)")[2:])
TOKEN = b"\x11" * 20


def logs(blocks: range, note: str = "v1", tx: int = 0) -> pa.Table:
    """One ERC-20 Transfer log per block (log_index 0); `tx` varies the transaction hashes."""
    n = list(blocks)
    word = lambda b: b"\x00" * 12 + bytes([b % 256]) * 20  # noqa: E731
    return pa.table(
        {
            "block_number": pa.array(n, pa.int64()),
            "transaction_hash": pa.array([(tx * 1_000_000 + b).to_bytes(32, "big") for b in n]),
            "log_index": pa.array([0] * len(n), pa.int32()),
            "address": pa.array([TOKEN] * len(n)),
            "topic0": pa.array([TRANSFER] * len(n)),
            "topic1": pa.array([word(b) for b in n]),
            "topic2": pa.array([word(b + 1) for b in n]),
            "topic3": pa.array([None] * len(n), pa.binary()),
            "data": pa.array([(b + 1).to_bytes(32, "big") for b in n]),
            "note": pa.array([note] * len(n)),
        }
    )


def _claim(services: Services, task_id: UUID) -> tuple[dict[str, Any], TaskPayload]:
    d = services.dispatcher

    def attempt() -> tuple[dict[str, Any], TaskPayload] | None:
        try:
            c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
        except Conflict:  # backing off after a failed attempt
            return None
        lease = {"task_id": task_id, "attempt": c.attempt, "lease_token": c.lease_token}
        return lease, d.fetch(LeaseRef(**lease))

    return wait_for(attempt, 10, f"task {task_id} to be claimable")


def _put(store: ObjectStore, prefix: str, table: pa.Table) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.put(f"{prefix}part-00000.parquet", buf.getvalue())


def _children(services: Services, parent: UUID) -> dict[str, UUID]:
    with services.pool.connection() as conn:
        rows = conn.execute(
            "SELECT job, task_id FROM task_registry WHERE parent_task_id = %s", [parent]
        ).fetchall()
    return {r["job"]: r["task_id"] for r in rows}


def ingest(
    services: Services, start: int, end: int, table: pa.Table, failed_first: pa.Table | None = None
) -> tuple[str, dict[str, UUID]]:
    """A run of the ingest job committing [start, end): its files under the attempt's own keys,
    the commit and the event, exactly as an operator reports them. `failed_first`: an earlier
    attempt wrote these files and failed (they stay, never committed). Returns the committed
    location and the tasks the event started."""
    store = make_store(services.settings)
    (task_id,) = services.control.trigger(admin(services), "imm")["tasks"]
    lease, p = _claim(services, task_id)
    out = p.outputs[0]
    assert out.location is not None
    if failed_first is not None:
        _put(store, attempt_prefix(range_prefix(out.location, start, end), p), failed_first)
        r = services.dispatcher.complete(CompleteRequest(**lease, outcome="failed", error="x"))
        assert r.status == "queued"
        lease, p = _claim(services, task_id)
        assert p.attempt == 2
    prefix = attempt_prefix(range_prefix(out.location, start, end), p)
    _put(store, prefix, table)
    rng = RangeSpec(start=start, end=end)
    done = services.dispatcher.complete(
        CompleteRequest(
            **lease,
            outcome="succeeded",
            final_events=[
                EventIn(dataset_uuid=out.dataset_uuid, range=rng, payload={"location": prefix})
            ],
            outputs=[
                OutputCommit(
                    dataset_uuid=out.dataset_uuid, range=rng, location=prefix, row_count=len(table)
                )
            ],
        )
    )
    assert done.status == "succeeded" and done.outputs_committed == 1
    return prefix, _children(services, task_id)


def run(services: Services, task_id: UUID, fn: Any, tmp: Path, **env: str) -> TaskPayload:
    """Runs an operator in this process on the task's real payload and reports its result."""
    lease, p = _claim(services, task_id)
    work = tmp / f"{task_id}.{p.attempt}"
    work.mkdir(parents=True)
    ctx = OperatorContext(
        task=p, workdir=work, _send=lambda _m: None, env=env, _store=make_store(services.settings)
    )
    try:
        result = fn(ctx)
    finally:
        ctx.close()
    done = services.dispatcher.complete(
        CompleteRequest(
            **lease, outcome="succeeded", final_events=result.events, outputs=result.outputs
        )
    )
    assert done.status == "succeeded"
    return p


def q(services: Services, sql: str) -> list[list[Any]]:
    return services.query.query(admin(services), sql).as_json()["rows"]  # type: ignore[no-any-return]


def keys(services: Services, prefix: str) -> list[str]:
    return [o.key for o in list_all(make_store(services.settings), prefix)]


def collector(services: Services) -> Collector:
    return Collector(
        services.pool,
        make_store(services.settings),
        sink_dsn(services.settings, services.dsn),  # as api/background.py builds it
        grace_seconds=0,
        batch_size=2,  # several batches in one pass
    )


def retired(services: Services) -> list[dict[str, Any]]:
    with services.pool.connection() as conn:
        return conn.execute(
            "SELECT location, reason, backend, deleted_at FROM retired_locations ORDER BY id"
        ).fetchall()


@pytest.fixture
def imm(services: Services) -> Services:
    services.control.deploy(admin(services), DAG)
    return services


def test_a_query_pinned_before_a_replay_reads_the_old_files_to_the_end(imm: Services) -> None:
    old, _ = ingest(imm, 0, 50, logs(range(0, 50), "v1"))
    plan = imm.query.plan(admin(imm), "SELECT count(*), min(note), max(note) FROM logs")
    with imm.pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM query_pins").fetchone()["n"] == 1

    new, _ = ingest(imm, 0, 50, logs(range(0, 50), "v2"))  # a replay of the range
    assert new != old and new.rsplit("t=", 1)[0] == old.rsplit("t=", 1)[0]  # same range
    assert [(r["location"], r["reason"], r["backend"]) for r in retired(imm)] == [
        (old, "superseded", "parquet")
    ]
    # The pinned query is still running: nothing it may read is deleted.
    assert collector(imm).collect() == 0
    assert keys(imm, old) and keys(imm, new)
    assert imm.query.execute(plan).as_json()["rows"] == [[50, "v1", "v1"]]

    # The query ended (its pin with it): the superseded files go, the committed ones stay.
    with imm.pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM query_pins").fetchone()["n"] == 0
    assert collector(imm).collect() == 1
    assert keys(imm, old) == [] and keys(imm, new)
    assert retired(imm)[0]["deleted_at"] is not None
    assert q(imm, "SELECT count(*), min(note), max(note) FROM logs") == [[50, "v2", "v2"]]


def test_an_expired_pin_no_longer_holds_files(imm: Services) -> None:
    old, _ = ingest(imm, 0, 50, logs(range(0, 50), "v1"))
    plan = imm.query.plan(admin(imm), "SELECT count(*) FROM logs")
    ingest(imm, 0, 50, logs(range(0, 50), "v2"))
    assert collector(imm).collect() == 0
    with imm.pool.connection() as conn:  # its process died: the lease runs out
        conn.execute("UPDATE query_pins SET expires_at = now() - interval '1 second'")
    assert collector(imm).collect() == 1 and keys(imm, old) == []
    imm.query.release(plan)


def test_the_collector_never_deletes_a_committed_location(imm: Services) -> None:
    store = make_store(imm.settings)
    committed, _ = ingest(imm, 0, 50, logs(range(0, 50)))
    scope = committed.rsplit("t=", 1)[0]  # the range's prefix, above every attempt's keys
    version = scope.rsplit("range=", 1)[0]
    stray = f"{scope}t=00000000-0000-0000-0000-000000000000.1/"  # an attempt never committed
    _put(store, stray, logs(range(0, 50), "stray"))
    with imm.pool.connection() as conn:
        org = conn.execute("SELECT org_id FROM orgs LIMIT 1").fetchone()["org_id"]
        hot_table = conn.execute(
            "SELECT v.location FROM datasets ds JOIN dataset_current c USING (dataset_uuid)"
            " JOIN dataset_versions v ON v.dataset_version = c.dataset_version"
            " WHERE ds.dataset_name = 'logs_hot'"
        ).fetchone()["location"]
        # The hot table is committed once a range of it is (commits name the table).
        conn.execute(
            "INSERT INTO dataset_commits (commit_id, dataset_uuid, dataset_version, task_id,"
            " attempt, scope, location) SELECT gen_random_uuid(), c.dataset_uuid,"
            " c.dataset_version, gen_random_uuid(), 1, 'all', %s FROM dataset_current c"
            " JOIN datasets ds USING (dataset_uuid) WHERE ds.dataset_name = 'logs_hot'",
            [hot_table],
        )
        # What an admin or a bug might retire: the committed location, its ancestors, a
        # committed table, a prefix without its '/', and (the control) a real leftover.
        for backend, location in [
            ("parquet", committed),
            ("parquet", scope),
            ("parquet", version),
            ("postgres", hot_table),
            ("parquet", scope.rstrip("/")),
            ("parquet", stray),
        ]:
            conn.execute(
                "INSERT INTO retired_locations (org_id, backend, location, reason)"
                " VALUES (%s, %s, %s, 'purged')",
                [org, backend, location],
            )
    assert collector(imm).collect() == 1
    assert [r["location"] for r in retired(imm) if r["deleted_at"] is not None] == [stray]
    assert keys(imm, stray) == [] and keys(imm, committed)
    with psycopg.connect(imm.data_dsn) as conn:  # a committed table is never dropped
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {hot_table.split('.')[0]}")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {hot_table} (x int)")
    assert collector(imm).collect() == 0
    with psycopg.connect(imm.data_dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s) IS NOT NULL", [hot_table]).fetchone() == (True,)


# -- readers follow commits; append + unique_key (real Spark) ---------------------------------


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = tspark.get_spark()
    yield session
    tspark.stop_spark()


def test_readers_read_only_the_committed_attempt_after_a_retry(
    imm: Services, spark: Any, tmp_path: Path
) -> None:
    # Attempt 1 wrote 50 blocks of other transactions, then failed; attempt 2 committed 30.
    _, tasks = ingest(imm, 0, 50, logs(range(0, 30)), failed_first=logs(range(0, 50), "x", tx=7))
    run(imm, tasks["transfers"], decode_erc20_transfers, tmp_path)
    run(imm, tasks["hot"], hot_window, tmp_path, TRACE_SINK_DSN=imm.data_dsn)
    assert q(imm, "SELECT count(*), max(block_number) FROM erc20_transfers") == [[30, 29]]
    with psycopg.connect(imm.data_dsn) as conn:
        assert conn.execute("SELECT count(*), min(note) FROM published.logs_hot").fetchone() == (
            30,
            "v1",
        )


def test_a_replayed_or_overlapping_range_of_an_append_output_repeats_no_key(
    imm: Services, spark: Any, tmp_path: Path
) -> None:
    count = "SELECT count(*), count(DISTINCT tx_hash || ':' || log_index) FROM erc20_transfers"
    _, first = ingest(imm, 0, 50, logs(range(0, 50)))
    run(imm, first["transfers"], decode_erc20_transfers, tmp_path)
    assert q(imm, count) == [[50, 50]]
    # A replay of the range replaces its own commit (not appended to).
    _, replay = ingest(imm, 0, 50, logs(range(0, 50)))
    run(imm, replay["transfers"], decode_erc20_transfers, tmp_path)
    assert q(imm, count) == [[50, 50]]
    # An overlapping range (other chunking) with a log repeated in it: blocks 25..49 are
    # already committed by [0, 50); only 50..74 are new.
    overlapping = logs(range(25, 75))
    p = run(
        imm,
        ingest(imm, 25, 75, pa.concat_tables([overlapping, overlapping.slice(40, 1)]))[1][
            "transfers"
        ],
        decode_erc20_transfers,
        tmp_path,
    )
    assert [c.scope for c in p.committed if c.dataset_version == p.outputs[0].dataset_version] == [
        "range:0-50"
    ]
    assert q(imm, count) == [[75, 75]]
    assert q(imm, "SELECT min(block_number), max(block_number) FROM erc20_transfers") == [[0, 74]]


def test_the_collector_deletes_only_what_the_platform_made(imm: Services) -> None:
    """Issue 38: a retired row is a request, not an order. The platform's own tables, another
    org's files, the org's whole prefix and anything outside `dataset_<hex>.v_<hex>` are
    logged and left (never offered again); and the login it drops tables with cannot drop a
    state table even when asked directly."""
    store = make_store(imm.settings)
    committed, _ = ingest(imm, 0, 50, logs(range(0, 50)))
    version = committed.rsplit("range=", 1)[0]
    with imm.pool.connection() as conn:
        org = conn.execute("SELECT org_id FROM orgs LIMIT 1").fetchone()["org_id"]
    other_org = UUID(int=7)
    foreign = version.replace(str(org), str(other_org), 1)
    _put(store, foreign, logs(range(0, 5), "another org's"))
    leftover = f"{version}range=0000000000-0000000050/t=00000000-0000-0000-0000-000000000000.1/"
    _put(store, leftover, logs(range(0, 5), "stray"))
    asked = [
        ("postgres", "public.api_keys"),
        ("postgres", "outbox"),
        ("postgres", "dataset_x.v_y; DROP TABLE api_keys"),
        ("parquet", f"org/{org}/dataset/"),
        ("parquet", foreign),
        ("parquet", f"{version}../"),
        ("parquet", "tmp/"),
        ("parquet", leftover),  # the control: a real leftover of this org's version
    ]
    with imm.pool.connection() as conn:
        for backend, location in asked:
            conn.execute(
                "INSERT INTO retired_locations (org_id, backend, location, reason)"
                " VALUES (%s, %s, %s, 'purged')",
                [org, backend, location],
            )
    assert collector(imm).collect() == 1
    rows = {r["location"]: r for r in retired(imm)}
    assert rows[leftover]["deleted_at"] is not None and keys(imm, leftover) == []
    refused = [loc for _, loc in asked[:-1]]
    with imm.pool.connection() as conn:
        marks = conn.execute(
            "SELECT location, refused, deleted_at FROM retired_locations WHERE location = ANY(%s)",
            [refused],
        ).fetchall()
        assert conn.execute("SELECT to_regclass('public.api_keys') IS NOT NULL").fetchone()
    assert len(marks) == len(refused)
    assert all(m["deleted_at"] is None for m in marks)
    # The org's prefix lies above a committed location: `collectable` never offers it.
    assert sorted(m["location"] for m in marks if not m["refused"]) == [f"org/{org}/dataset/"]
    assert keys(imm, foreign) and keys(imm, committed)
    assert collector(imm).collect() == 0  # refused rows are not offered again
    # Defence in depth: the collector's own login cannot drop what the state login owns.
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        collector(imm)._drop_table("public.api_keys")
