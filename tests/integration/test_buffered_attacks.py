"""Attacks on buffered Postgres datasets (issue 40), against a real Postgres: another org's
jobs and users, forged pointers, stale and canceled attempts, batches that lie, poison
batches that must dead-letter with a reason (never stall or kill the shared sink), and
declarations that try to corrupt a table."""

from __future__ import annotations

import dataclasses
import io
import json
import threading
import uuid
from typing import Any
from uuid import UUID

import psycopg
import pytest

from tests.support.buffers import batch_key, object_store, publish, sink, table_rows, write_lines
from tests.support.dags import admin, user
from tests.support.parquet_bombs import BOMBS, LIMIT
from tests.support.wait import wait_for
from trace_platform.contract import Claim, ClaimRequest
from trace_platform.dag.validate import DagInvalid
from trace_platform.errors import Conflict, Forbidden, NotFound
from trace_platform.identity import Actor, ensure_user
from trace_platform.layout import buffer_prefix
from trace_platform.objectstore import ObjectStoreError
from trace_platform.services import Services
from trace_platform.sink.service import Sink

DAG = """
name: atk
jobs:
  rule:
    operator: noop
    buffer_outputs: [events]
  reader:
    operator: noop
    inputs: [{from: {dataset: events}}]
buffered:
  - name: events
    columns:
      - {name: k, type: text}
      - {name: amount, type: uint256, required: false}
      - {name: n, type: int64, required: false}
      - {name: f, type: float64, required: false}
      - {name: doc, type: json, required: false}
      - {name: note, type: text, required: false}
    unique_key: [k]
    writers: [atk.rule]
"""


def _claim(s: Services, dag: str = "atk", actor: Actor | None = None) -> Claim:
    (task_id,) = s.control.trigger(actor or admin(s), dag)["tasks"]
    return s.dispatcher.claim(ClaimRequest(task_id=UUID(str(task_id)), worker_id="w"))


def _key(s: Services, c: Claim, name: str = "b.jsonl", org: UUID | None = None) -> str:
    return batch_key(s, c, org or admin(s).org_id, name)


def _write_raw(s: Services, key: str, data: bytes) -> str:
    object_store(s).put(key, data)
    return key


def _write(s: Services, c: Claim, rows: list[Any], name: str = "b.jsonl", **kw: Any) -> str:
    return write_lines(s, _key(s, c, name, **kw), rows)


def _publish(s: Services, c: Claim, key: str, dataset: str = "events") -> Any:
    return publish(s, c, dataset, key)


_sink = sink


def _rows(s: Services, org: UUID | None = None) -> list[dict[str, Any]]:
    return table_rows(s, org or admin(s).org_id, "k")


def _records(s: Services, org: UUID | None = None) -> list[dict[str, Any]]:
    return s.dispatcher.buffers.list_records(org or admin(s).org_id)


def _other_org(s: Services) -> Actor:
    other = uuid.uuid4()
    with s.pool.connection() as conn, conn.transaction():
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, %s)", (other, f"o{other.hex}"))
        return ensure_user(conn, other, "eve", is_admin=True)


@pytest.fixture
def deployed(services: Services) -> Services:
    services.control.deploy(admin(services), DAG)
    return services


def _dead_then_good(s: Services, bad_rows: list[Any], reason: str) -> None:
    """A poison batch dead-letters with `reason` at once; the next good batch still lands."""
    c = _claim(s)
    _publish(s, c, _write(s, c, bad_rows, "bad.jsonl"))
    _publish(s, c, _write(s, c, [{"k": "good"}], "good.jsonl"))
    _sink(s).drain(timeout=20)
    by = {r["location"].rsplit("/", 1)[1]: r for r in _records(s)}
    assert by["bad.jsonl"]["status"] == "dead", by["bad.jsonl"]
    assert reason in by["bad.jsonl"]["error"], by["bad.jsonl"]["error"]
    assert by["good.jsonl"]["status"] == "loaded"
    assert [r["k"] for r in _rows(s)] == ["good"]


# -- other orgs --------------------------------------------------------------------------------


def test_another_org_declaring_the_same_name_writes_only_its_own_table(
    deployed: Services,
) -> None:
    s = deployed
    eve = _other_org(s)
    # The same DAG name and job name in another org: its writer 'atk.rule' is its own.
    s.control.deploy(eve, DAG)
    c = _claim(s, actor=eve)
    _publish(s, c, _write(s, c, [{"k": "eve"}], org=eve.org_id))
    _sink(s).drain(timeout=20)
    assert [r["k"] for r in _rows(s, eve.org_id)] == ["eve"]
    assert _rows(s) == [] and _records(s) == []
    assert [r["org_id"] for r in _rows(s, eve.org_id)] == [eve.org_id]


def test_another_orgs_job_cannot_write_an_orgs_dataset(deployed: Services) -> None:
    s = deployed
    eve = _other_org(s)
    # Listing the dataset from another org: it is no dataset of hers.
    mine = DAG.split("  reader:")[0]
    with pytest.raises(DagInvalid, match="unknown buffered dataset 'events'"):
        s.control.deploy(eve, mine)
    # Her own 'atk' (no buffered section) deploys once its outputs are dropped; its task
    # publishing to 'events' (the Lite org's) is refused: the dataset is looked up in her org.
    s.control.deploy(eve, mine.replace("    buffer_outputs: [events]\n", ""))
    c = _claim(s, actor=eve)
    with pytest.raises(Forbidden, match="may not publish"):
        _publish(s, c, _write(s, c, [{"k": "x"}], org=eve.org_id))
    # Nor with a pointer into the Lite org's prefix.
    with pytest.raises(Forbidden):
        _publish(s, c, _key(s, c))
    assert _records(s) == [] and _records(s, eve.org_id) == []


def test_another_orgs_user_and_a_user_without_read_roles_cannot_read_it(
    deployed: Services,
) -> None:
    s = deployed
    c = _claim(s)
    _publish(s, c, _write(s, c, [{"k": "secret"}]))
    _sink(s).drain(timeout=20)
    me = admin(s)
    assert s.query.query(me, "SELECT k FROM events").as_json()["rows"] == [["secret"]]
    s.control.set_read_roles(me, "events", ["auditors"], [])
    stranger, _ = user(s, "stranger")
    eve = _other_org(s)
    for who in (stranger, eve):
        with pytest.raises(NotFound):
            s.query.query(who, "SELECT count(*) FROM events")
        assert s.control.list_buffers(who) == []  # `trace buffers list`: not its records
    assert [r["dataset"] for r in s.control.list_buffers(me)] == ["events"]


def test_buffers_list_fills_its_limit_with_the_records_its_user_may_read(
    deployed: Services,
) -> None:
    """A newer batch of a dataset the user may not read never crowds a readable one out."""
    s = deployed
    me = admin(s)
    s.control.deploy(me, DAG.replace("atk", "hid").replace("events", "hidden"))
    c = _claim(s)
    _publish(s, c, _write(s, c, [{"k": "a"}]))
    h = _claim(s, "hid")
    _publish(s, h, _write(s, h, [{"k": "b"}]), "hidden")
    s.control.set_read_roles(me, "events", ["auditors"], [])
    auditor, _ = user(s, "auditor", ["auditors"])
    assert [r["dataset"] for r in s.control.list_buffers(me, limit=1)] == ["hidden"]
    assert [r["dataset"] for r in s.control.list_buffers(auditor, limit=1)] == ["events"]


# -- pointers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "suffix",
    [
        "../t={task}.9/b.jsonl",
        "x/../../b.jsonl",
        "x//b.jsonl",
        "./b.jsonl",
        "x\\..\\b.jsonl",
        "b.jsonl\x00.jsonl",
    ],
)
def test_path_tricks_in_the_pointer_are_refused(deployed: Services, suffix: str) -> None:
    s = deployed
    c = _claim(s)
    key = _key(s, c, suffix.replace("{task}", str(c.task_id)))
    with pytest.raises(Forbidden):
        _publish(s, c, key)
    for absolute in ("/" + _key(s, c), "/etc/passwd.jsonl", "s3://other/" + _key(s, c)):
        with pytest.raises(Forbidden):
            _publish(s, c, absolute)
    assert _records(s) == []


def test_another_attempts_and_another_orgs_files_are_refused(deployed: Services) -> None:
    s = deployed
    c = _claim(s)
    earlier = f"{buffer_prefix(admin(s).org_id, c.task_id, c.attempt + 1)}b.jsonl"
    foreign = f"{buffer_prefix(uuid.uuid4(), c.task_id, c.attempt)}b.jsonl"
    task_root = f"org/{admin(s).org_id}/buffers/task={c.task_id}/b.jsonl"
    for key in (earlier, foreign, task_root):
        with pytest.raises(Forbidden, match="buffer prefix"):
            _publish(s, c, key)
    assert _records(s) == []


def test_a_canceled_attempt_cannot_publish(deployed: Services) -> None:
    s = deployed
    c = _claim(s)
    key = _write(s, c, [{"k": "late"}])
    s.control.cancel_task(admin(s), c.task_id)
    with pytest.raises(Conflict, match="was canceled; its batches are no longer accepted"):
        _publish(s, c, key)
    assert _records(s) == []


# -- batches that lie --------------------------------------------------------------------------


def test_a_json_column_holding_a_fraction_lands(deployed: Services) -> None:
    s = deployed
    c = _claim(s)
    _publish(s, c, _write(s, c, [{"k": "a", "doc": {"price": 1.5, "n": [1, 2.25e3]}}]))
    _sink(s).drain(timeout=20)
    (rec,) = _records(s)
    assert rec["status"] == "loaded", rec
    (row,) = _rows(s)
    assert row["doc"] == {"price": 1.5, "n": [1, 2250]}


@pytest.mark.parametrize(
    "bad, reason",
    [
        ('{"k": "a", "note": "\\ud800"}', "row 1, column 'note' (text)"),
        ('{"k": "\\ud800x"}', "row 1, column 'k' (text)"),
        ('{"k": "a", "doc": {"x": "\\u0000"}}', "row 1, column 'doc' (json)"),
        ('{"k": "a", "doc": {"\\ud800": 1}}', "row 1, column 'doc' (json)"),
        ('{"k": "a", "doc": "\\udc00"}', "row 1, column 'doc' (json)"),
    ],
)
def test_text_postgres_cannot_store_dead_letters_with_its_reason(
    deployed: Services, bad: str, reason: str
) -> None:
    _dead_then_good(deployed, [bad], reason)


@pytest.mark.parametrize(
    "bad, reason",
    [
        ('{"k": "a", "\\ud800": 1}', "undeclared column(s)"),
        ('{"k": "a", "x\\u0000y": 1}', "undeclared column(s)"),
    ],
)
def test_a_reason_quoting_unstorable_text_is_still_stored(
    deployed: Services, bad: str, reason: str
) -> None:
    _dead_then_good(deployed, [bad], reason)


def test_a_key_too_long_for_the_unique_index_dead_letters_with_its_reason(
    deployed: Services,
) -> None:
    import random

    rnd = random.Random(7)  # incompressible: Postgres cannot squeeze it under the index limit
    huge = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(20_000))
    _dead_then_good(deployed, [{"k": huge}], "row 1")


@pytest.mark.parametrize(
    "limbs",
    [
        {f"l{i}": 0 for i in range(9)} | {"l0": -1, "l1": 1},  # "999999999" by a negative limb
        {f"l{i}": 0 for i in range(9)} | {"l0": 10**12},  # a limb wider than 10^9
    ],
)
def test_limbs_outside_their_base_are_refused(deployed: Services, limbs: dict[str, int]) -> None:
    _dead_then_good(deployed, [{"k": "a", "amount": limbs}], "row 1, column 'amount' (uint256)")


@pytest.mark.parametrize(
    "bad, reason",
    [
        ({"k": "a", "amount": str(2**256)}, "outside uint256"),
        ({"k": "a", "amount": -1}, "outside uint256"),
        ({"k": "a", "amount": "1e3"}, "column 'amount'"),
        ({"k": "a", "n": 2**63}, "outside int64"),
        ({"k": "a", "n": True}, "column 'n'"),
        ('{"k": "a", "f": NaN}', "line 1 is not JSON"),
        ('{"k": "a", "f": Infinity}', "line 1 is not JSON"),
        ('{"k": "a", "f": 1e999}', "not a finite number"),
        ({"k": None}, "required column 'k'"),
        ({"k": "a", "org_id": 5, "zzz": 1}, "undeclared column(s) zzz"),
        ("[" * 5000 + "]" * 5000, "line 1 is not JSON"),
        ('{"k": "a", "n": ' + "9" * 5000 + "}", "line 1 is not JSON"),
    ],
)
def test_values_that_do_not_fit_are_refused(deployed: Services, bad: Any, reason: str) -> None:
    _dead_then_good(deployed, [bad], reason)


def test_duplicate_keys_in_one_batch_and_an_empty_batch(deployed: Services) -> None:
    s = deployed
    c = _claim(s)
    _publish(s, c, _write(s, c, [{"k": "a", "n": 1}, {"k": "a", "n": 2}, {"k": "b"}]))
    _publish(s, c, _write_raw(s, _key(s, c, "empty.jsonl"), b""))
    _sink(s).drain(timeout=20)
    assert {r["status"] for r in _records(s)} == {"loaded"}
    assert [(r["k"], r["n"]) for r in _rows(s)] == [("a", 1), ("b", None)]


def test_rows_over_max_rows_and_bytes_are_refused(services: Services) -> None:
    s = services
    s.control.deploy(
        admin(s), DAG.replace("writers: [atk.rule]", "writers: [atk.rule]\n    max_rows: 2")
    )
    _dead_then_good(s, [{"k": "a"}, {"k": "b"}, {"k": "c"}], "more than 2 rows")


def test_a_parquet_batch_whose_schema_differs_is_refused(deployed: Services) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    s = deployed
    c = _claim(s)
    buf = io.BytesIO()
    pq.write_table(pa.table({"k": [1, 2], "n": ["x", "y"]}), buf)
    _publish(s, c, _write_raw(s, _key(s, c, "bad.parquet"), buf.getvalue()))
    buf = io.BytesIO()
    pq.write_table(pa.table({"k": ["p"], "amount": [str(2**256 - 1)]}), buf)
    _publish(s, c, _write_raw(s, _key(s, c, "good.parquet"), buf.getvalue()))
    _sink(s).drain(timeout=20)
    by = {r["location"].rsplit("/", 1)[1]: r for r in _records(s)}
    assert by["bad.parquet"]["status"] == "dead"
    assert "row 1, column 'k' (text): expected a string" in by["bad.parquet"]["error"]
    assert by["good.parquet"]["status"] == "loaded"
    assert [int(r["amount"]) for r in _rows(s)] == [2**256 - 1]


def test_a_parquet_bomb_is_refused_before_it_decodes_in_full(deployed: Services) -> None:
    """A small, highly compressed batch (one dictionary value repeated) that decodes to ~8 MiB
    dead-letters once its decoded bytes pass the platform's bound, whatever max_bytes says."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    s = deployed
    c = _claim(s)
    buf = io.BytesIO()
    pq.write_table(pa.table({"k": ["x" * 1000] * 8192}), buf, compression="zstd")
    assert len(buf.getvalue()) < 64 * 1024  # small as stored
    _publish(s, c, _write_raw(s, _key(s, c, "bomb.parquet"), buf.getvalue()))
    _publish(s, c, _write(s, c, [{"k": "good"}], "good.jsonl"))
    sink = _sink(s, max_batch_bytes=1024 * 1024)
    sink.drain(timeout=20)
    by = {r["location"].rsplit("/", 1)[1]: r for r in _records(s)}
    assert by["bomb.parquet"]["status"] == "dead", by["bomb.parquet"]
    assert "decodes to more than 1048576 bytes" in by["bomb.parquet"]["error"]
    assert by["good.jsonl"]["status"] == "loaded"
    assert [r["k"] for r in _rows(s)] == ["good"]


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_parquet_bomb_is_refused_from_its_footer_and_pages_before_decoding(
    deployed: Services, bomb: str
) -> None:
    """Batches of a few KB that expand past the bound: one huge cell (refused from the footer,
    its compressed frames broken so any decoding would fail otherwise), the same cell under a
    footer that lies (refused from the page headers), one dictionary value repeated 20,000
    times and a list of a million values (refused before they expand). Each dead-letters with
    its reason; the next good batch lands."""
    make, reason = BOMBS[bomb]
    s = deployed
    c = _claim(s)
    data = make()
    assert len(data) < 4096  # small as stored
    _publish(s, c, _write_raw(s, _key(s, c, "bomb.parquet"), data))
    _publish(s, c, _write(s, c, [{"k": "good"}], "good.jsonl"))
    _sink(s, max_batch_bytes=LIMIT).drain(timeout=20)
    by = {r["location"].rsplit("/", 1)[1]: r for r in _records(s)}
    assert by["bomb.parquet"]["status"] == "dead", by["bomb.parquet"]
    error = by["bomb.parquet"]["error"]
    assert reason in error and "TRACE_SINK_MAX_BATCH_BYTES" in error, error
    assert by["good.jsonl"]["status"] == "loaded"
    assert [r["k"] for r in _rows(s)] == ["good"]


def test_the_platforms_batch_bound_caps_every_datasets_max_bytes(deployed: Services) -> None:
    """A dataset's max_bytes (default 64 MiB) never lets a batch past the sink's own bound."""
    s = deployed
    c = _claim(s)
    rows = [{"k": f"row{i}", "note": "x" * 40} for i in range(20)]  # ~1 KB
    _publish(s, c, _write(s, c, rows, "big.jsonl"))
    _publish(s, c, _write(s, c, [{"k": "good"}], "good.jsonl"))
    _sink(s, max_batch_bytes=200).drain(timeout=20)
    by = {r["location"].rsplit("/", 1)[1]: r for r in _records(s)}
    assert by["big.jsonl"]["status"] == "dead", by["big.jsonl"]
    assert "over 200 bytes" in by["big.jsonl"]["error"]
    assert "TRACE_SINK_MAX_BATCH_BYTES" in by["big.jsonl"]["error"]
    assert [r["k"] for r in _rows(s)] == ["good"]


def test_max_bytes_over_the_platforms_bound_is_refused_at_deploy(services: Services) -> None:
    limit = services.settings.sink_max_batch_bytes
    body = DAG.replace("writers: [atk.rule]", f"writers: [atk.rule]\n    max_bytes: {limit + 1}")
    with pytest.raises(DagInvalid, match="TRACE_SINK_MAX_BATCH_BYTES") as e:
        services.control.deploy(admin(services), body)
    assert "buffered[0].max_bytes" in str(e.value)
    with services.pool.connection() as conn:
        assert conn.execute("SELECT 1 FROM buffered_datasets").fetchone() is None
    services.control.deploy(  # at the bound: taken
        admin(services),
        DAG.replace("writers: [atk.rule]", f"writers: [atk.rule]\n    max_bytes: {limit}"),
    )


# -- declarations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "column",
    [
        '"k; DROP TABLE dags; --"',
        '"K"',
        '"a\\"b"',
        "org_id",
        "loaded_at",
    ],
)
def test_column_names_that_are_not_plain_names_are_refused(services: Services, column: str) -> None:
    body = DAG.replace("{name: note, type: text", "{name: " + column + ", type: text")
    with pytest.raises(DagInvalid):
        services.control.deploy(admin(services), body)
    with services.pool.connection() as conn:
        assert conn.execute("SELECT 1 FROM buffered_datasets").fetchone() is None


def test_long_column_names_postgres_would_truncate_are_refused(services: Services) -> None:
    a, b = "a" * 63 + "x", "a" * 63 + "y"  # the same column once Postgres cuts them to 63
    body = DAG.replace("{name: note, type: text", "{name: " + a + ", type: text").replace(
        "{name: f, type: float64", "{name: " + b + ", type: float64"
    )
    with pytest.raises(DagInvalid, match="63"):
        services.control.deploy(admin(services), body)


@pytest.mark.parametrize(
    "change",
    [
        ("{name: note, type: text, required: false}", "{name: note, type: json, required: false}"),
        ("{name: note, type: text, required: false}", "{name: note, type: text}"),
        ("{name: k, type: text}", "{name: k, type: text}\n      - {name: k2, type: text}"),
        ("      - {name: note, type: text, required: false}\n", ""),
        (
            "      - {name: note,",
            "      - {name: extra, type: text, required: false}\n      - {name: note,",
        ),
    ],
)
def test_a_redeploy_cannot_change_the_columns_or_key(
    deployed: Services, change: tuple[str, str]
) -> None:
    s = deployed
    c = _claim(s)
    _publish(s, c, _write(s, c, [{"k": "kept", "note": "n"}]))
    _sink(s).drain(timeout=20)
    with pytest.raises(DagInvalid, match="cannot change"):
        s.control.deploy(admin(s), DAG.replace(*change))
    assert [(r["k"], r["note"]) for r in _rows(s)] == [("kept", "n")]


def test_a_dataset_another_dag_declares_cannot_be_taken_or_shadowed(deployed: Services) -> None:
    s = deployed
    me = admin(s)
    thief = (
        DAG.replace("name: atk", "name: thief")
        .replace("atk.rule", "thief.rule")
        .replace("    buffer_outputs: [events]\n", "")
    )
    with pytest.raises(DagInvalid, match="declared by another DAG"):
        s.control.deploy(me, thief)
    publisher = """
name: shadow
jobs:
  make:
    operator: noop
    outputs: [{backend: object, name: out}]
publish:
  - {dataset: events, output: out}
"""
    with pytest.raises((DagInvalid, Conflict, Forbidden)):
        s.control.deploy(me, publisher)
    with s.pool.connection() as conn:
        (row,) = conn.execute(
            "SELECT producer_job FROM datasets WHERE dataset_name = 'events'"
        ).fetchall()
    assert row["producer_job"] == "buffered:events"


# -- the sink ----------------------------------------------------------------------------------


def test_malformed_and_foreign_messages_are_dropped_and_the_record_still_lands(
    deployed: Services,
) -> None:
    s = deployed
    c = _claim(s)
    rec = _publish(s, c, _write(s, c, [{"k": "a"}]))
    queue = f"buffer.{rec.dataset_uuid.hex}"
    with pytest.raises(Exception, match="bytes"):
        s.driver.publish(
            queue,
            {"kind": "buffer_record", "dataset_uuid": str(rec.dataset_uuid), "x": "y" * 300_000},
        )
    with s.pool.connection() as conn, conn.transaction():  # bypass the driver's checks
        conn.execute(
            "INSERT INTO queue_messages (queue_name, payload) VALUES (%s, %s), (%s, %s)",
            (
                queue,
                psycopg.types.json.Jsonb({"kind": "buffer_record", "junk": "z" * 300_000}),
                queue,
                psycopg.types.json.Jsonb(
                    {
                        "kind": "buffer_record",
                        "dataset_uuid": str(uuid.uuid4()),
                        "record_id": str(rec.record_id),
                    }
                ),
            ),
        )
    _sink(s).drain(timeout=20)
    assert [r["status"] for r in _records(s)] == ["loaded"]
    assert [r["k"] for r in _rows(s)] == ["a"]


def test_two_sinks_racing_on_one_record_land_it_once(deployed: Services) -> None:
    s = deployed
    c = _claim(s)
    rec = _publish(s, c, _write(s, c, [{"k": f"r{i}"} for i in range(200)]))
    s.publisher.drain()
    sinks = [_sink(s), _sink(s)]
    results: list[str] = []

    def run(sink: Sink) -> None:
        results.append(sink._load(rec.record_id))

    threads = [threading.Thread(target=run, args=(k,)) for k in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) in (["done", "loaded"], ["loaded", "loaded"])
    (r,) = _records(s)
    assert r["status"] == "loaded" and r["rows_loaded"] == 200
    assert len(_rows(s)) == 200
    with s.pool.connection() as conn:
        n = conn.execute("SELECT count(*) AS n FROM task_registry WHERE job = 'reader'").fetchone()
    assert n["n"] == 1


def test_a_dataset_whose_table_cannot_be_made_stalls_no_other_orgs_sink(
    deployed: Services,
) -> None:
    s = deployed
    eve = _other_org(s)
    s.control.deploy(eve, DAG)
    # Eve's table cannot be made (declared before names were capped at 63: two columns
    # Postgres cuts to one name): the Lite org's batches still land.
    long = [{"name": "a" * 63 + c, "type": "text", "required": True} for c in "xy"]
    with s.pool.connection() as conn, conn.transaction():
        conn.execute(
            "UPDATE buffered_datasets SET columns = columns || %s::jsonb WHERE org_id = %s",
            (json.dumps(long), eve.org_id),
        )
    c = _claim(s)
    _publish(s, c, _write(s, c, [{"k": "mine"}]))
    _sink(s).drain(timeout=20)
    assert [r["status"] for r in _records(s)] == ["loaded"]
    assert [r["k"] for r in _rows(s)] == ["mine"]


def test_a_batch_rewritten_larger_after_its_size_was_listed_is_refused(
    services: Services,
) -> None:
    s = services
    s.control.deploy(
        admin(s), DAG.replace("writers: [atk.rule]", "writers: [atk.rule]\n    max_bytes: 100")
    )
    c = _claim(s)
    rows = [{"k": f"row{i}", "note": "x" * 40} for i in range(20)]  # ~1 KB, 10x the bound
    _publish(s, c, _write(s, c, rows, "bad.jsonl"))
    sink = _sink(s)
    real = sink.store

    class Listed:  # the listing saw the small artifact; the operator rewrote it since
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def list_page(self, prefix: str, token: str | None = None, limit: int = 1000) -> Any:
            page = real.list_page(prefix, token, limit)
            items = [dataclasses.replace(o, size=10) for o in page.items]
            return dataclasses.replace(page, items=items)

    sink.store = Listed()  # type: ignore[assignment]
    sink.drain(timeout=20)
    (rec,) = _records(s)
    assert rec["status"] == "dead" and "max_bytes" in rec["error"], rec
    assert _rows(s) == []


def test_a_record_out_of_tries_says_why_its_tries_failed(deployed: Services) -> None:
    s = deployed
    c = _claim(s)
    _publish(s, c, _write(s, c, [{"k": "a"}]))
    sink = _sink(s, max_tries=1)
    real = sink.store

    class Away:  # the object store fails every read
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def get_range(self, key: str, start: int, end: int) -> bytes:
            raise ObjectStoreError("store unreachable (connection refused)")

    sink.store = Away()  # type: ignore[assignment]
    sink.drain(timeout=5)
    wait_for(  # the next try, once the nack's delay has passed, finds it out of tries
        lambda: sink.drain(timeout=5) and _records(s)[0]["status"] != "pending", 30, "a try"
    )
    (rec,) = _records(s)
    assert rec["status"] == "dead", rec
    assert "not loaded after 1 tries" in rec["error"]
    assert "store unreachable (connection refused)" in rec["error"]
