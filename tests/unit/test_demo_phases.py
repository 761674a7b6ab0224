"""`trace demo`'s own timings: each backfill stage spans its first task's start to its last
task's finish, bookkeeping jobs left out."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console

from trace_platform.lite.demo.backfill import stage_of
from trace_platform.lite.demo.phases import Phases

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def task(job: str, start: float, end: float | None) -> dict[str, Any]:
    return {
        "job": job,
        "started_at": T0 + timedelta(seconds=start),
        "finished_at": None if end is None else T0 + timedelta(seconds=end),
    }


def test_each_stage_spans_its_tasks_and_bookkeeping_is_left_out() -> None:
    tasks = [
        task("backfill", 0, 1),
        task("ingest", 1, 11),
        task("ingest", 3, 20),
        task("transfers_complete", 20, 21),
        task("token_supply", 21, 25),
        task("staking_periods", 22, 30),
        task("hot", 5, None),  # never finished: no span to give
    ]
    phases = Phases()
    phases.stages(tasks, stage_of(tasks))
    rows = {name.strip(): (seconds, note) for name, seconds, note in phases.rows}
    assert rows == {
        "Cryo sync (blocks, txs, logs, traces)": (19.0, "2 tasks"),
        "analytics (Spark SQL)": (9.0, "2 tasks"),
    }
    out = io.StringIO()
    phases.report(Console(file=out, width=120))
    assert "Where the time went" in out.getvalue() and "total" in out.getvalue()
