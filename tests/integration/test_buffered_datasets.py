"""Buffered Postgres datasets against a real Postgres: deploy-time writers, the fenced buffer
publish (record + outbox in one transaction, a small message on the dataset's own queue),
and the trusted sink's idempotent upsert, its dead letters and its dataset event."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any
from uuid import UUID

import pytest

from tests.support.buffers import batch_key, publish, sink, table_rows, write_lines
from tests.support.dags import admin
from tests.support.invariants import expire_lease
from tests.support.queue_outage import AwayFirst
from tests.support.wait import wait_for
from trace_platform.contract import Claim, ClaimRequest
from trace_platform.dag.validate import DagInvalid
from trace_platform.errors import Conflict, Forbidden
from trace_platform.layout import buffer_prefix
from trace_platform.services import Services

DECLARING = """
name: alerts
jobs:
  rule:
    operator: noop
    buffer_outputs: [alert_events]
  reader:
    operator: noop
    inputs: [{from: {dataset: alert_events}}]
buffered:
  - name: alert_events
    columns:
      - {name: dedupe_key, type: text}
      - {name: amount, type: uint256}
      - {name: block_time, type: timestamp}
      - {name: note, type: text, required: false}
    unique_key: [dedupe_key]
    writers: [alerts.rule, other.rule]
"""

OTHER = """
name: other
jobs:
  rule:
    operator: noop
    buffer_outputs: [alert_events]
"""

BIG = 2**256 - 1  # the largest uint256: exact all the way into the table


def _claim(services: Services, dag: str) -> Claim:
    me = admin(services)
    (task_id,) = services.control.trigger(me, dag)["tasks"]
    return services.dispatcher.claim(ClaimRequest(task_id=UUID(str(task_id)), worker_id="w"))


def _write(services: Services, c: Claim, rows: list[Any], name: str = "b.jsonl") -> str:
    return write_lines(services, batch_key(services, c, admin(services).org_id, name), rows)


def _publish(services: Services, c: Claim, key: str, dataset: str = "alert_events") -> Any:
    return publish(services, c, dataset, key)


_sink = sink


def _rows(services: Services) -> list[dict[str, Any]]:
    return table_rows(services, admin(services).org_id, "dedupe_key")


def _records(services: Services) -> list[dict[str, Any]]:
    return services.dispatcher.buffers.list_records(admin(services).org_id)


def _row(key: str, amount: int = BIG, **kw: Any) -> dict[str, Any]:
    return {"dedupe_key": key, "amount": str(amount), "block_time": 1_700_000_000, **kw}


@pytest.fixture
def deployed(services: Services) -> Services:
    services.control.deploy(admin(services), DECLARING)
    return services


def test_a_batch_published_twice_and_loaded_twice_lands_each_row_once(deployed: Services) -> None:
    s = deployed
    c = _claim(s, "alerts")
    key = _write(s, c, [_row("a"), _row("b", 5)])
    first = _publish(s, c, key)
    again = _publish(s, c, key)  # a retried call: the same record, no second message
    assert again.duplicate and again.record_id == first.record_id
    other = _write(s, c, [_row("b", 5), _row("c", 7)], "c.jsonl")  # overlaps on "b"
    _publish(s, c, other)
    with s.pool.connection() as conn:
        msgs = conn.execute(
            "SELECT queue_name, payload FROM outbox WHERE queue_name LIKE 'buffer.%%'"
        ).fetchall()
    assert len(msgs) == 2
    assert msgs[0]["queue_name"] == f"buffer.{first.dataset_uuid.hex}"
    assert set(msgs[0]["payload"]) == {"kind", "dataset_uuid", "record_id"}
    assert _sink(s).drain() == 2
    rows = _rows(s)
    assert [(r["dedupe_key"], int(r["amount"])) for r in rows] == [("a", BIG), ("b", 5), ("c", 7)]
    assert {r["status"] for r in _records(s)} == {"loaded"}
    # The dataset's event started its reader (another task of the DAG, on its own run).
    with s.pool.connection() as conn:
        readers = conn.execute(
            "SELECT count(*) AS n FROM task_registry WHERE job = 'reader'"
        ).fetchone()
    assert readers["n"] == 2  # one per loaded batch


def test_rows_claiming_another_org_land_under_the_trusted_one(deployed: Services) -> None:
    s = deployed
    c = _claim(s, "alerts")
    _publish(s, c, _write(s, c, [_row("x", org_id=str(uuid.uuid4()))]))
    _sink(s).drain()
    (row,) = _rows(s)
    assert row["org_id"] == admin(s).org_id


def test_a_malformed_batch_dead_letters_with_its_reason_while_the_next_lands(
    deployed: Services,
) -> None:
    s = deployed
    c = _claim(s, "alerts")
    bad = _write(
        s, c, [_row("ok"), {"dedupe_key": "y", "amount": "-1", "block_time": 1}], "bad.jsonl"
    )
    _publish(s, c, bad)
    _publish(s, c, _write(s, c, [_row("good")], "good.jsonl"))
    assert _sink(s).drain() == 2
    by_status = {r["status"]: r for r in _records(s)}
    assert "row 2, column 'amount' (uint256)" in by_status["dead"]["error"]
    assert by_status["loaded"]["rows_loaded"] == 1
    assert [r["dedupe_key"] for r in _rows(s)] == ["good"]  # nothing of the bad batch


def test_a_record_counts_every_row_it_read_and_the_new_ones_it_loaded(deployed: Services) -> None:
    """What `trace buffers list` shows: rows read and rows loaded, on the direct COPY (all
    keys new) and on the fallback (a stored key, a key repeated in the batch)."""
    s = deployed
    c = _claim(s, "alerts")
    _publish(s, c, _write(s, c, [_row("a"), _row("b")], "first.jsonl"))
    assert _sink(s).drain() == 1
    _publish(s, c, _write(s, c, [_row("b"), _row("c"), _row("c")], "second.jsonl"))
    assert _sink(s).drain() == 1
    by = {r["location"].rsplit("/", 1)[1]: r for r in _records(s)}
    assert [
        (by[n]["rows_read"], by[n]["rows_loaded"]) for n in ("first.jsonl", "second.jsonl")
    ] == [
        (2, 2),
        (3, 1),
    ]
    assert [r["dedupe_key"] for r in _rows(s)] == ["a", "b", "c"]


@pytest.mark.parametrize("stored_first", [False, True])
def test_a_row_refused_after_thousands_were_streamed_lands_none_of_its_batch(
    deployed: Services, stored_first: bool
) -> None:
    """Rows are checked as the sink streams them into the table: a bad one after 3,000 good
    ones (sent to Postgres already), on the direct COPY or on the fallback after a stored
    key, dead-letters the batch with its row named, and none of its rows stay."""
    s = deployed
    c = _claim(s, "alerts")
    _publish(s, c, _write(s, c, [_row("kept")], "first.jsonl"))
    good = [_row(f"k{i:05}") for i in range(3000)]
    bad = {"dedupe_key": "zz", "amount": "-1", "block_time": 1}
    rows = [_row("kept"), *good, bad] if stored_first else [*good, bad]
    _publish(s, c, _write(s, c, rows, "big.jsonl"))
    assert _sink(s).drain() == 2
    dead = [r for r in _records(s) if r["status"] == "dead"]
    assert len(dead) == 1 and f"row {len(rows)}, column 'amount'" in dead[0]["error"]
    assert [r["dedupe_key"] for r in _rows(s)] == ["kept"]


@pytest.mark.parametrize(
    "rows, reason",
    [
        (["{not json"], "line 1 is not JSON"),
        ([{"amount": "1", "block_time": 1}], "required column 'dedupe_key'"),
        ([_row("a", surprise=1)], "undeclared column(s) surprise"),
        ([_row("a", amount=1.5)], "column 'amount'"),
    ],
)
def test_what_a_batch_may_not_hold(deployed: Services, rows: list[Any], reason: str) -> None:
    s = deployed
    c = _claim(s, "alerts")
    _publish(s, c, _write(s, c, rows))
    _sink(s).drain()
    (rec,) = _records(s)
    assert rec["status"] == "dead" and reason in rec["error"]


def test_a_job_not_among_the_writers_is_refused_at_deploy_and_at_publish(
    deployed: Services,
) -> None:
    s = deployed
    me = admin(s)
    with pytest.raises(Forbidden, match="not one of its writers"):
        s.control.deploy(me, OTHER.replace("name: other", "name: stranger"))
    with s.pool.connection() as conn:
        assert conn.execute("SELECT 1 FROM dags WHERE name = 'stranger'").fetchone() is None
    # A job allowed at deploy that the declaring DAG drops from its writers since.
    s.control.deploy(me, OTHER)
    s.control.deploy(me, DECLARING.replace("[alerts.rule, other.rule]", "[alerts.rule]"))
    c = _claim(s, "other")
    with pytest.raises(Forbidden):
        _publish(s, c, _write(s, c, [_row("z")]))
    with pytest.raises(Forbidden):  # the reader is no writer either
        _publish(s, c, _write(s, c, [_row("z")]), dataset="no_such_dataset")
    assert _records(s) == []
    with s.pool.connection() as conn:
        assert (
            conn.execute("SELECT 1 FROM outbox WHERE queue_name LIKE 'buffer.%%'").fetchone()
            is None
        )


def test_a_publish_outside_the_attempts_prefix_is_refused(deployed: Services) -> None:
    s = deployed
    c = _claim(s, "alerts")
    other_task = f"{buffer_prefix(admin(s).org_id, uuid.uuid4(), 1)}b.jsonl"
    with pytest.raises(Forbidden, match="buffer prefix"):
        _publish(s, c, other_task)
    assert _records(s) == []


def test_a_stale_attempts_publish_is_refused(deployed: Services) -> None:
    s = deployed
    c = _claim(s, "alerts")
    key = _write(s, c, [_row("late")])
    expire_lease(s, c.task_id)
    s.dispatcher.reap()
    c2 = s.dispatcher.claim(ClaimRequest(task_id=c.task_id, worker_id="w2"))
    assert c2.attempt == c.attempt + 1
    with pytest.raises(Conflict, match="stale"):
        _publish(s, c, key)
    assert _records(s) == []


def test_a_declared_dataset_keeps_its_columns_and_rows_through_redeploys(
    deployed: Services,
) -> None:
    s = deployed
    c = _claim(s, "alerts")
    _publish(s, c, _write(s, c, [_row("kept")]))
    _sink(s).drain()
    with pytest.raises(DagInvalid, match="cannot change"):
        s.control.deploy(admin(s), DECLARING.replace("type: timestamp", "type: int64"))
    s.control.deploy(
        admin(s), DECLARING.replace("operator: noop\n    inputs", "operator: fail\n    inputs")
    )
    assert [r["dedupe_key"] for r in _rows(s)] == ["kept"]


def test_a_sink_killed_mid_batch_and_after_its_upsert_loses_and_doubles_nothing(
    deployed: Services, tmp_path: Any
) -> None:
    s = deployed
    c = _claim(s, "alerts")
    _publish(s, c, _write(s, c, [_row(f"k{i}", i) for i in range(50)]))
    s.publisher.drain()
    script = (
        "import sys; from trace_platform.config import Settings;"
        "from trace_platform.services import Services;"
        "from trace_platform.objectstore import make_store;"
        "from trace_platform.sink.service import Sink;"
        "s = Services.build(Settings.model_validate_json(sys.argv[1]), sys.argv[2]);"
        "Sink(s.dispatcher, s.driver, make_store(s.settings), s.data_dsn,"
        " visibility_seconds=0.5).drain()"
    )
    conf = s.settings.model_dump_json()
    for fault in ("sink.mid_batch", "sink.after_upsert"):
        env = {**os.environ, "TRACE_FAULTS": fault}
        p = subprocess.run([sys.executable, "-c", script, conf, s.dsn], env=env, timeout=60)
        assert p.returncode == -9, fault  # SIGKILLed at the point, as a crash would
    assert len(_rows(s)) == 50  # the second kill came after its commit: all in, record pending
    assert _records(s)[0]["status"] == "pending"
    again = _sink(s)  # lands it once the killed sink's lease ends
    wait_for(lambda: again.drain() and _records(s)[0]["status"] == "loaded", 30, "the record")
    rows = _rows(s)
    assert sorted(int(r["amount"]) for r in rows) == list(range(50))
    assert _records(s)[0]["status"] == "loaded"


def test_a_serving_sink_looks_again_soon_after_work_then_backs_off(deployed: Services) -> None:
    """A batch published moments after another landed (an alert's routed deliveries after its
    alerts) lands at once, not after the sink's idle pause (10 s here)."""
    s = deployed
    c = _claim(s, "alerts")
    first = _publish(s, c, _write(s, c, [_row("a")]))
    s.publisher.drain()
    stop = threading.Event()
    loader = _sink(s)
    serving = threading.Thread(target=loader.serve, args=(stop, 10.0), daemon=True)
    serving.start()

    def loaded(record_id: UUID) -> bool:
        return any(r["record_id"] == record_id and r["status"] == "loaded" for r in _records(s))

    try:
        wait_for(lambda: loaded(first.record_id), 30, "the first batch loaded")
        t0 = time.monotonic()
        second = _publish(s, c, _write(s, c, [_row("b")], "c.jsonl"))
        s.publisher.drain()
        wait_for(lambda: loaded(second.record_id), 30, "the second batch loaded")
        assert time.monotonic() - t0 < 5.0
    finally:
        stop.set()
        serving.join(15)
    assert [r["dedupe_key"] for r in _rows(s)] == ["a", "b"]


def test_a_serving_sink_outlives_a_queue_outage(deployed: Services) -> None:
    """A queue that is away (SQS unreachable, throttled: QueueUnavailable) for the sink's first
    receives does not end its loop: it waits and tries again, and lands the batch once the
    queue is back."""
    s = deployed
    c = _claim(s, "alerts")
    record = _publish(s, c, _write(s, c, [_row("a")]))
    s.publisher.drain()
    stop = threading.Event()
    loader = _sink(s)
    loader.driver = away = AwayFirst(loader.driver, failures=3)  # type: ignore[assignment]
    serving = threading.Thread(target=loader.serve, args=(stop, 0.05), daemon=True)
    serving.start()
    try:
        wait_for(
            lambda: any(
                r["record_id"] == record.record_id and r["status"] == "loaded" for r in _records(s)
            ),
            30,
            "the batch loaded after the outage",
        )
        assert serving.is_alive() and away.refused == 3
    finally:
        stop.set()
        serving.join(15)
    assert [r["dedupe_key"] for r in _rows(s)] == ["a"]


def test_the_collector_is_paused_while_a_batch_loads_and_back_after(
    deployed: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cyclic garbage collector does not run over a batch's rows while it loads (it was an
    eighth of the sink's CPU), and is back on afterwards, also after a refused batch."""
    from trace_platform.sink import service

    seen: list[bool] = []
    real = service.checking

    def checking(*args: Any) -> Any:
        seen.append(gc.isenabled())
        return real(*args)

    monkeypatch.setattr(service, "checking", checking)
    s = deployed
    c = _claim(s, "alerts")
    _publish(s, c, _write(s, c, [_row("a")]))
    _publish(s, c, _write(s, c, [{"dedupe_key": "b", "amount": "x"}], "bad.jsonl"))
    assert gc.isenabled()
    _sink(s).drain()
    assert seen == [False, False] and gc.isenabled()
    assert sorted(r["status"] for r in _records(s)) == ["dead", "loaded"]
