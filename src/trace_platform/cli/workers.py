"""`trace workers`: the worker registry (dispatcher/fleet.py), as an org admin sees it."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from trace_platform.cli.control import me, run_op, services
from trace_platform.cli.safe_text import safe

console = Console()
workers_app = typer.Typer(
    help="The worker fleet: each worker's host, version, slots and last beat.",
    no_args_is_help=True,
)
STATE_COLOUR = {"alive": "green", "stopped": "white", "dead": "red"}


def age_text(seconds: float) -> str:
    """A beat's age, short: 0.4s, 12s, 5m, 3h, 2d."""
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f}s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


@workers_app.command("list")
def workers_list(
    state: Annotated[
        Literal["alive", "stopped", "dead"] | None, typer.Option(help="only workers in this state")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Registered workers, alive first: id, host, version, slots, your org's running tasks on
    it, the age of the last beat and the state (a worker silent for three beats is declared
    dead)."""
    from trace_platform.control.workers import list_workers

    got = run_op(list_workers, services().dispatcher, me(), state, limit)
    if as_json:
        console.print_json(json.dumps([w.model_dump(mode="json") for w in got]))
        return
    table = Table(
        "worker", "host", "version", "slots", "running", "last beat", "state", title="workers"
    )
    for w in got:
        colour = STATE_COLOUR[w.state]
        state_text = f"[{colour}]{w.state}[/{colour}]"
        if w.ended_reason and w.state == "dead":
            state_text += f" [dim]{safe(w.ended_reason, one_line=True)}[/dim]"
        table.add_row(
            safe(w.worker_id),
            safe(w.host),
            safe(w.version),
            str(w.slots),
            str(w.running),
            f"{age_text(w.beat_age_seconds)} ago",
            state_text,
        )
    console.print(table)
