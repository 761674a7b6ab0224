"""The collector and buffer batches' artifacts, against a real Postgres and object store: a
landed batch's artifact is deleted after the grace, a dead one's only after its retention, a
pending one's never; an artifact published to two datasets goes only once both records are
settled; a record whose key is not its attempt's is refused, not deleted."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from tests.support.buffers import batch_key, object_store, publish, sink, write_lines
from tests.support.dags import admin
from trace_platform.contract import Claim, ClaimRequest
from trace_platform.db.pool import sink_dsn
from trace_platform.objectstore import NoSuchKey
from trace_platform.registry.collector import Collector
from trace_platform.services import Services

DAG = """
name: col
jobs:
  w: {operator: noop, buffer_outputs: [one, two]}
buffered:
  - {name: one, columns: [{name: k, type: text}], unique_key: [k], writers: [col.w]}
  - {name: two, columns: [{name: k, type: text}], unique_key: [k], writers: [col.w]}
"""


def _claim(s: Services) -> Claim:
    (task_id,) = s.control.trigger(admin(s), "col")["tasks"]
    return s.dispatcher.claim(ClaimRequest(task_id=UUID(str(task_id)), worker_id="w"))


def _batch(s: Services, c: Claim, name: str, rows: list[Any]) -> str:
    return write_lines(s, batch_key(s, c, admin(s).org_id, name), rows)


def _collector(s: Services, dead_retention: float) -> Collector:
    return Collector(
        s.pool,
        object_store(s),
        sink_dsn(s.settings, s.dsn),
        grace_seconds=0,
        batch_size=1,  # several batches in one pass
        dead_retention_seconds=dead_retention,
    )


def _exists(s: Services, key: str) -> bool:
    try:
        object_store(s).get_range(key, 0, 1)
    except NoSuchKey:
        return False
    return True


def _records(s: Services) -> dict[str, dict[str, Any]]:
    """The artifact's file name (and dataset) -> its record."""
    with s.pool.connection() as conn:
        rows = conn.execute(
            "SELECT r.*, b.name AS dataset FROM buffer_records r JOIN buffered_datasets b"
            " USING (dataset_uuid)"
        ).fetchall()
    return {f"{r['dataset']}:{r['location'].rsplit('/', 1)[1]}": r for r in rows}


def test_landed_and_old_dead_batches_artifacts_are_deleted_pending_ones_kept(
    services: Services,
) -> None:
    s = services
    s.control.deploy(admin(s), DAG)
    c = _claim(s)
    landed = _batch(s, c, "landed.jsonl", [{"k": "a"}])
    dead = _batch(s, c, "dead.jsonl", ["not json"])
    for key in (landed, dead):
        publish(s, c, "one", key)
    sink(s).drain(timeout=20)
    pending = _batch(s, c, "pending.jsonl", [{"k": "b"}])
    publish(s, c, "one", pending)  # not loaded yet
    by = _records(s)
    assert [by[f"one:{n}.jsonl"]["status"] for n in ("landed", "dead", "pending")] == [
        "loaded",
        "dead",
        "pending",
    ]

    # A pass within the dead batch's retention: only the landed batch's artifact goes.
    assert _collector(s, dead_retention=3600).collect() == 1
    assert [_exists(s, k) for k in (landed, dead, pending)] == [False, True, True]
    by = _records(s)
    assert by["one:landed.jsonl"]["artifact_deleted_at"] is not None
    assert by["one:dead.jsonl"]["artifact_deleted_at"] is None
    # Past its retention the dead one goes too; the pending one stays, and still lands.
    assert _collector(s, dead_retention=0).collect() == 1
    assert [_exists(s, k) for k in (landed, dead, pending)] == [False, False, True]
    sink(s).drain(timeout=20)
    assert _records(s)["one:pending.jsonl"]["status"] == "loaded"
    assert _collector(s, dead_retention=0).collect() == 1
    assert not _exists(s, pending)
    assert _collector(s, dead_retention=0).collect() == 0  # each artifact once


def test_an_artifact_published_to_two_datasets_goes_once_both_are_settled(
    services: Services,
) -> None:
    s = services
    s.control.deploy(admin(s), DAG)
    c = _claim(s)
    shared = _batch(s, c, "shared.jsonl", [{"k": "a"}])
    publish(s, c, "one", shared)
    publish(s, c, "two", shared)
    sink(s, datasets=["one"]).drain(timeout=20)  # "two" not loaded yet
    assert [_records(s)[f"{d}:shared.jsonl"]["status"] for d in ("one", "two")] == [
        "loaded",
        "pending",
    ]
    assert _collector(s, dead_retention=0).collect() == 0
    assert _exists(s, shared)  # "two" still needs it
    sink(s, datasets=["two"]).drain(timeout=20)
    assert _records(s)["two:shared.jsonl"]["status"] == "loaded"
    assert _collector(s, dead_retention=0).collect() == 2
    assert not _exists(s, shared)


def test_a_record_whose_key_is_not_its_attempts_is_refused_not_deleted(
    services: Services,
) -> None:
    """The collector deletes only what the attempt could write, whatever a row says (a row
    altered in the state store points at another attempt's batch)."""
    s = services
    s.control.deploy(admin(s), DAG)
    c = _claim(s)
    mine = _batch(s, c, "mine.jsonl", [{"k": "a"}])
    publish(s, c, "one", mine)
    sink(s).drain(timeout=20)
    other = batch_key(s, c, admin(s).org_id, "x").replace(f".{c.attempt}/", f".{c.attempt + 1}/")
    write_lines(s, other, [{"k": "z"}])
    with s.pool.connection() as conn:
        conn.execute("UPDATE buffer_records SET location = %s", (other,))
    assert _collector(s, dead_retention=0).collect() == 0
    assert _exists(s, other)
    assert "not a key below" in _records(s)["one:x"]["artifact_refused"]
    assert _collector(s, dead_retention=0).collect() == 0  # never offered again
