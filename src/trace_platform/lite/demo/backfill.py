"""The backfill: trigger the demo DAG over the plan's range and follow its run with one
progress bar per stage until every task has finished."""

from __future__ import annotations

import time
from collections.abc import Container
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trace_platform.contract import TERMINAL, progress_text
from trace_platform.lite.demo.dag import DAG_NAME
from trace_platform.lite.demo.data import RAW, admin, coverage
from trace_platform.lite.demo.plan import DemoPlan
from trace_platform.services import Services

STAGES = [
    ("ingest", "Cryo sync (blocks, txs, logs, traces)"),
    ("hot", "hot window → Postgres"),
    ("transfers", "decode ERC20 transfers (Spark)"),
    ("staking", "decode staking events (Spark)"),
    ("analytics", "analytics (Spark SQL)"),
]


def backfill(svc: Services, plan: DemoPlan, console: Console) -> list[dict[str, Any]] | None:
    """The run's tasks once all have ended, or None when one failed."""
    me = admin(svc)
    run = svc.control.trigger(
        me,
        DAG_NAME,
        config={
            "from_block": plan.from_block,
            "to_block": plan.to_block,
            "chunk_size": plan.chunk_size,
        },
    )
    run_id = run["run_id"]
    columns = (
        TextColumn("{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    totals = {
        "ingest": plan.ranges,
        "hot": 4 * plan.ranges,
        "transfers": plan.ranges,
        "staking": plan.ranges,
    }
    with Progress(*columns, console=console, refresh_per_second=4) as progress:
        bars = {
            job: progress.add_task(what, total=totals.get(job), info="") for job, what in STAGES
        }
        while True:
            tasks = svc.control.show_run(me, run_id)["tasks"]
            by_job = _by_stage(tasks, totals)
            rows = {n: int(r["row_count"]) for n, r in coverage(svc, RAW).items()}
            for job, bar in bars.items():
                mine = by_job.get(job, [])
                done = sum(t["status"] in TERMINAL for t in mine)
                failed = sum(t["status"] == "failed" for t in mine)
                info = f"[red]{failed} failed[/red]" if failed else ""
                # What a running task of the stage last reported (its heartbeat's progress).
                now = [t["progress"] for t in mine if t["status"] == "running" and t["progress"]]
                if now:
                    info = f"{escape(progress_text(now[0], 40))} {info}"
                if job == "ingest":
                    info = f"{rows.get('blocks', 0):,} blocks, {rows.get('transactions', 0):,} txs, {rows.get('logs', 0):,} logs {info}"
                total = totals.get(job) or max(len(mine), 1)
                progress.update(bar, completed=done, total=total, info=info)
            failing = any(t["status"] == "failed" for t in tasks)
            if (
                tasks
                and all(t["status"] in TERMINAL for t in tasks)
                and (len(tasks) > 1 or failing)
            ):
                # Downstream tasks are created with their upstream's completion, so when all
                # are terminal the run is over (a failed first task ends it alone).
                break
            time.sleep(0.5)
    failed = [t for t in tasks if t["status"] != "succeeded"]
    for t in failed:
        console.print(f"[red]{t['job']} failed:[/red] {t['last_error']}")
    console.print(
        f"run {run_id}: {len(tasks)} tasks (see it: [cyan]trace runs show {run_id}[/cyan])"
    )
    return None if failed else tasks


def stage_of(tasks: list[dict[str, Any]]) -> dict[str, str]:
    """Each job of the run by the stage its progress bar shows (bookkeeping jobs left out)."""
    names = dict(STAGES)
    return {t["job"]: names[stage] for stage, mine in _by_stage(tasks, names).items() for t in mine}


def _by_stage(
    tasks: list[dict[str, Any]], counted: Container[str]
) -> dict[str, list[dict[str, Any]]]:
    """The run's tasks by progress bar: counted stages by job, every other job as analytics."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for t in tasks:
        if t["job"] == "backfill" or t["job"].endswith("_complete"):
            continue  # the splitter and the aggregators: bookkeeping, not stages
        job = t["job"] if t["job"] in counted else "analytics"
        by_job.setdefault(job, []).append(t)
    return by_job
