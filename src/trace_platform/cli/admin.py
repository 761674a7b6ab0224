"""`trace admin`: operator commands over the state database itself (its DSN is the credential:
they act on every org's rows, so no tenant's API key runs them)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from trace_platform.cli.control import run_op
from trace_platform.cli.safe_text import safe

console = Console()
admin_app = typer.Typer(
    help="Operator commands on the state database (its DSN, not an API key).",
    no_args_is_help=True,
)


class _Bar:
    """retention.run.Progress on a rich progress bar: one task line per step."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None

    def start(self, description: str, total: int | None) -> None:
        self.task = self.progress.add_task(safe(description), total=total)

    def advance(self, rows: int) -> None:
        if self.task is not None:
            self.progress.advance(self.task, rows)


@admin_app.command("retention")
def retention(
    older_than: Annotated[
        int,
        typer.Option(
            "--older-than", min=1, help="take months wholly older than this many days (UTC)"
        ),
    ],
    export: Annotated[
        bool, typer.Option("--export", help="export each month to Parquet before dropping it")
    ] = False,
    no_export: Annotated[
        bool, typer.Option("--no-export", help="drop without exporting: the rows are lost")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="say what would go, and change nothing")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Retention by partition: each month of task history (task registry, attempts, events,
    status and progress, audit log) older than --older-than days is exported to Parquet in the
    object store, read back and checked (row count and key checksum), recorded, then detached
    and dropped, never deleted row by row. A month with unfinished tasks, the current month,
    and any month while a DAG rebuilds are refused. Each month dropped is told to every org's
    audit log (retention.drop, actor system). Exported history stays queryable by each
    org's admins as the datasets _history_<table> (their own org's rows). Run it again after
    any failure: it finishes what was begun."""
    from trace_platform.config import get_settings
    from trace_platform.db.pool import state_dsn
    from trace_platform.objectstore import make_store
    from trace_platform.retention.run import Retention

    settings = get_settings()
    dsn = state_dsn(settings)
    store = make_store(settings)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=as_json,
    ) as bar:
        job = Retention(dsn, store, progress=_Bar(bar))
        months = run_op(job.run, older_than, export=export, no_export=no_export, dry_run=dry_run)
    if as_json:
        console.print_json(json.dumps([asdict(m) for m in months]))
        return
    if not months:
        console.print(f"no month of task history is older than {older_than} days")
        return
    table = Table("month", "table", "rows", "files", "action", title="retention")
    for m in months:
        for u in m.units:
            table.add_row(m.label, safe(u.relname), str(u.rows), str(u.files), safe(u.action))
        for why in m.refused:
            table.add_row(m.label, "", "", "", f"[yellow]refused:[/yellow] {safe(why)}")
    console.print(table)
