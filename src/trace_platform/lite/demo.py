"""`trace demo` (until the Monad demo DAG lands): a handful of tasks through the Lite stack."""

from __future__ import annotations

import time
from pathlib import Path
from uuid import UUID

from rich.console import Console
from rich.live import Live
from rich.table import Table

from trace_platform.config import Settings
from trace_platform.dispatcher.models import TERMINAL, TaskSpec, TaskView
from trace_platform.lite.stack import LiteStack

EXAMPLE_DAG = Path(__file__).resolve().parents[3] / "examples" / "dags" / "hello.yaml"

DEMO_TASKS: list[tuple[str, TaskSpec]] = [
    ("a no-op", TaskSpec(job="demo_noop", operator="noop")),
    (
        "sleeps 2 s, reporting progress",
        TaskSpec(job="demo_sleep", operator="sleep", config={"seconds": 2}),
    ),
    (
        "fails once, succeeds on retry",
        TaskSpec(
            job="demo_flaky",
            operator="fail",
            config={"succeed_on_attempt": 2},
            retry_backoff_seconds=0.5,
        ),
    ),
    (
        "fails permanently (no retry)",
        TaskSpec(
            job="demo_broken", operator="fail", config={"permanent": True, "message": "bad config"}
        ),
    ),
    (
        "emits 5 events (2 bundled with completion)",
        TaskSpec(job="demo_events", operator="emit_events", config={"count": 5, "final": 2}),
    ),
    (
        "a long sleep, canceled while running",
        TaskSpec(job="demo_cancel", operator="sleep", config={"seconds": 60}),
    ),
]


def _table(rows: list[tuple[str, TaskView]], t0: float) -> Table:
    table = Table(
        "task",
        "what",
        "status",
        "attempt",
        "events",
        "last error",
        title=f"Trace Lite demo — {time.monotonic() - t0:.1f}s",
    )
    for what, v in rows:
        colour = {
            "succeeded": "green",
            "failed": "red",
            "canceled": "yellow",
            "running": "cyan",
        }.get(v.status, "white")
        table.add_row(
            str(v.task_id)[:8],
            what,
            f"[{colour}]{v.status}[/{colour}]",
            str(v.attempt),
            str(v.events),
            (v.last_error or "")[:50],
        )
    return table


def _dag_run(stack: LiteStack, console: Console) -> bool:
    """Deploy the example DAG (source -> transform -> sink) and follow one run of it."""
    from trace_platform.cli.control import run_tree
    from trace_platform.identity import lite_admin

    svc = stack.services
    with svc.pool.connection() as conn:
        admin = lite_admin(conn)
    res = svc.control.deploy(admin, EXAMPLE_DAG.read_text(), str(EXAMPLE_DAG))
    console.print(
        f"\n[bold]Deployed DAG '{res.name}'[/bold] version {res.version}; triggering a run…"
    )
    run_id = svc.control.trigger(admin, res.name)["run_id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run = svc.control.show_run(admin, run_id)
        if run["tasks"] and all(t["status"] in TERMINAL for t in run["tasks"]):
            break
        time.sleep(0.1)
    console.print(run_tree(run))
    for d in svc.control.list_datasets(admin):
        console.print(
            f"  dataset [cyan]{d['dataset_name']}[/cyan] {d['dataset_uuid']} version {d['current_version']}"
        )
    console.print(f"See it again: [cyan]trace runs show {run_id}[/cyan]")
    return all(t["status"] == "succeeded" for t in run["tasks"])


def run_demo(settings: Settings, *, workers: int = 2, console: Console | None = None) -> int:
    console = console or Console()
    t0 = time.monotonic()
    console.print("[bold]Starting Trace Lite[/bold] (embedded Postgres, pgqueue, API, workers)…")
    with LiteStack(settings, workers=workers) as stack:
        d = stack.services.dispatcher
        console.print(f"API at {stack.url}; state in Postgres at {settings.pg_data_dir}")
        ids: list[tuple[str, UUID]] = [
            (what, d.create_task(spec).task_id) for what, spec in DEMO_TASKS
        ]
        cancel_id = ids[-1][1]
        canceled = False
        deadline = time.monotonic() + 120
        transitions: list[str] = []
        last: dict[UUID, tuple[str, int]] = {}
        with Live(console=console, refresh_per_second=8) as live:
            while True:
                views = [(what, d.get_task(tid)) for what, tid in ids]
                for what, v in views:
                    state = (v.status, v.attempt)
                    if last.get(v.task_id) != state:
                        transitions.append(
                            f"{time.monotonic() - t0:6.2f}s  {what}: {v.status} "
                            f"(attempt {v.attempt})"
                        )
                        last[v.task_id] = state
                live.update(_table(views, t0))
                if not canceled and views[-1][1].status == "running":
                    d.cancel(cancel_id)
                    canceled = True
                if all(v.status in TERMINAL for _, v in views) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        console.print("\n[bold]Lifecycle transitions[/bold]")
        for line in transitions:
            console.print("  " + line)
        ok_dag = _dag_run(stack, console)
        stack.services.publisher.drain()
        pending = stack.services.publisher.pending()
        dead = stack.services.driver.dead_letters(settings.task_queue)
        console.print(f"\noutbox pending: {pending}; dead letters: {len(dead)}")
        console.print(
            "See one task: [cyan]trace task show <id>[/cyan]; all: [cyan]trace task list[/cyan]"
        )
        ok = all(v.status in TERMINAL for _, v in views) and ok_dag
    console.print(f"done in {time.monotonic() - t0:.1f}s")
    return 0 if ok else 1
