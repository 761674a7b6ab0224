"""`trace audit list`: the org's audit log (trace_platform/audit.py), for org admins."""

from __future__ import annotations

import json
from datetime import UTC
from typing import Annotated, Any

import typer
from rich.table import Table

from trace_platform.cli.control import console, me, run_op, services
from trace_platform.cli.safe_text import safe

audit_app = typer.Typer(
    help="The audit log: who deployed, triggered, granted or changed what (org admins).",
    no_args_is_help=True,
)
OUTCOME_COLOUR = {"ok": "green", "dry_run": "cyan", "noop": "white"}


def details_text(details: dict[str, Any]) -> str:
    """A row's details on one line: `key=value`, lists joined by commas, nothing empty."""
    parts = []
    for k, v in details.items():
        if v is None or v == [] or v == {}:
            continue
        shown = ",".join(str(x) for x in v) if isinstance(v, list) else v
        parts.append(f"{k}={shown}")
    return " ".join(parts)


@audit_app.command("list")
def audit_list(
    actor: Annotated[
        str | None,
        typer.Option(help="only this actor: a user's name, or system, scheduler, eventbridge"),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="from this time on: 30m, 24h, 7d, 2w back, or an ISO date or time"),
    ] = None,
    action: Annotated[
        str | None, typer.Option(help="only this action (dag.deploy, secret.set, ...)")
    ] = None,
    dag: Annotated[str | None, typer.Option(help="only actions concerning this DAG")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    before: Annotated[
        str | None, typer.Option(help="the page after this cursor (the `next` of a page)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Who did what, newest first: each action's time, actor, what it named, how it ended
    (ok, dry_run, noop), where it came from (cli, http, webhook, eventbridge, scheduler,
    system) and its details. A refused or failed action is not listed: a row is written in
    the action's own transaction."""
    page = run_op(
        services().control.audit_log,
        me(),
        who=actor,
        since=since,
        action=action,
        dag=dag,
        limit=limit,
        before=before,
    )
    if as_json:
        console.print_json(json.dumps(page, default=str))
        return
    table = Table("at (UTC)", "actor", "action", "target", "outcome", "via", "details")
    for e in page["entries"]:
        colour = OUTCOME_COLOUR.get(e["outcome"], "white")
        table.add_row(
            e["at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
            safe(e["actor"]),
            e["action"],
            safe(e["target"]),
            f"[{colour}]{e['outcome']}[/{colour}]",
            e["source"],
            safe(details_text(e["details"]), one_line=True),
        )
    console.print(table)
    if page["next"]:
        console.print(f"more: --before {page['next']}", highlight=False)
