"""Progress reports: bounded on the wire, shown short and escaped (operator text)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rich.console import Console

from trace_platform.cli.control import run_tree
from trace_platform.contract import (
    MAX_PROGRESS_BYTES,
    Claim,
    HeartbeatRequest,
    progress_text,
)
from trace_platform.worker.reports import bounded_progress

CLAIM = Claim(
    task_id=uuid.uuid4(),
    start_day=1,
    attempt=1,
    lease_token=uuid.uuid4(),
    lease_until=datetime.now(UTC),
    heartbeat_seconds=5,
)


def test_progress_text_is_one_short_line() -> None:
    assert progress_text({"datatype": "logs", "rows": 1204, "ok": True}) == (
        "datatype=logs rows=1,204 ok=True"
    )
    assert progress_text(None) == "" and progress_text({}) == ""
    long = progress_text({"k": "x" * 500}, width=40)
    assert len(long) == 40 and long.endswith("…")


def test_the_heartbeat_carries_at_most_a_small_report() -> None:
    ref: dict[str, Any] = {"task_id": CLAIM.task_id, "attempt": 1, "lease_token": CLAIM.lease_token}
    HeartbeatRequest(**ref, progress={"x": "y" * (MAX_PROGRESS_BYTES - 20)})
    with pytest.raises(ValueError, match="progress is larger"):
        HeartbeatRequest(**ref, progress={"x": "y" * MAX_PROGRESS_BYTES})
    # The wrapper never sends what the API would refuse (a refused heartbeat loses the lease).
    assert bounded_progress({"rows": 5}, CLAIM) == {"rows": 5}
    big = bounded_progress({"x": "y" * MAX_PROGRESS_BYTES}, CLAIM)
    assert big is not None and "over 4096 bytes" in big["dropped"]
    HeartbeatRequest(**ref, progress=big)
    assert bounded_progress(["not", "an", "object"], CLAIM) is None


def test_a_reports_size_is_its_utf8_bytes_on_the_wire() -> None:
    """Counted as the heartbeat sends it (UTF-8, not json's \\u escapes): 3,000 bytes of
    non-ASCII text go, 4,200 do not, on both sides."""
    ref: dict[str, Any] = {"task_id": CLAIM.task_id, "attempt": 1, "lease_token": CLAIM.lease_token}
    fits = {"x": "é" * 1500}
    assert len(json.dumps(fits)) > MAX_PROGRESS_BYTES  # json would have counted 9,000
    assert bounded_progress(fits, CLAIM) == fits
    assert HeartbeatRequest(**ref, progress=fits).progress == fits
    over = {"x": "é" * 2100}
    assert "dropped" in (bounded_progress(over, CLAIM) or {})
    with pytest.raises(ValueError, match="progress is larger"):
        HeartbeatRequest(**ref, progress=over)


def test_a_report_the_heartbeat_cannot_serialize_is_dropped() -> None:
    """Small, but nested deeper than the heartbeat body's serializer goes (a heartbeat that
    cannot be sent costs the attempt its lease)."""
    deep: dict[str, Any] = {}
    for _ in range(300):
        deep = {"a": deep}
    assert len(json.dumps(deep)) < MAX_PROGRESS_BYTES
    got = bounded_progress(deep, CLAIM)
    assert got is not None and "dropped" in got
    ref: dict[str, Any] = {"task_id": CLAIM.task_id, "attempt": 1, "lease_token": CLAIM.lease_token}
    HeartbeatRequest(**ref, progress=got).model_dump_json()


def test_runs_show_prints_each_tasks_last_report_as_text() -> None:
    now = datetime.now(UTC)
    task = {
        "task_id": uuid.uuid4(),
        "parent_task_id": None,
        "job": "ingest",
        "status": "running",
        "attempt": 1,
        "started_at": now - timedelta(seconds=3),
        "finished_at": None,
        "last_error": None,
        "progress": {"datatype": "[bold]logs[/bold]", "rows": 1204},
    }
    run = {"run_id": uuid.uuid4(), "dag": "d", "dag_version": 1, "kind": "manual", "trigger": "t"}
    console = Console(width=200, record=True)
    console.print(run_tree({**run, "tasks": [task]}))
    text = console.export_text()
    assert "datatype=[bold]logs[/bold] rows=1,204" in text  # markup shown, not applied
