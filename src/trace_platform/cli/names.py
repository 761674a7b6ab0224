"""`trace names`: who may publish which dataset names (admins grant a name or a prefix to a user
or a role), and an admin taking a published name back (registry/names.py)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from trace_platform.cli.control import console, me, run_op, services
from trace_platform.cli.safe_text import safe

names_app = typer.Typer(
    help="Published dataset names: grants (admins) and taking a name back.", no_args_is_help=True
)

User = Annotated[str | None, typer.Option("--user", help="grant to this user")]
Role = Annotated[str | None, typer.Option("--role", help="grant to holders of this role")]
Pattern = Annotated[str, typer.Argument(help="a dataset name, or a prefix ending in * (team_a_*)")]


@names_app.command("grant")
def names_grant(pattern: Pattern, user: User = None, role: Role = None) -> None:
    """Let a user or a role publish a name or every name with a prefix (admins only). Once an
    org has a grant, names no grant covers are the admins' to publish."""
    g = run_op(services().control.grant_name, me(), pattern, user=user, role=role)
    who = f"user {g['user']}" if g["user"] else f"role {g['role']}"
    console.print(f"granted {safe(g['pattern'])} to {safe(who)}", highlight=False)


@names_app.command("revoke")
def names_revoke(pattern: Pattern, user: User = None, role: Role = None) -> None:
    """Remove a grant (admins only); what was published stays (`trace names reclaim`)."""
    g = run_op(services().control.revoke_name, me(), pattern, user=user, role=role)
    who = f"user {g['user']}" if g["user"] else f"role {g['role']}"
    console.print(f"revoked {safe(g['pattern'])} from {safe(who)}", highlight=False)


@names_app.command("list")
def names_list() -> None:
    """The org's grants, the names admins reclaimed, and the platform's reserved names."""
    res = run_op(services().control.list_names, me())
    table = Table("name or prefix", "user", "role", "granted by", "at", title="grants")
    for g in res["grants"]:
        table.add_row(
            safe(g["pattern"]),
            safe(g["user"] or ""),
            safe(g["role"] or ""),
            safe(g["granted_by"]),
            f"{g['granted_at']:%Y-%m-%d %H:%M:%S}",
        )
    console.print(table)
    if res["reclaimed"]:
        table = Table("name", "taken from DAG", "by", "at", title="reclaimed")
        for r in res["reclaimed"]:
            table.add_row(
                safe(r["name"]),
                safe(r["dag"]),
                safe(r["reclaimed_by"]),
                f"{r['reclaimed_at']:%Y-%m-%d %H:%M:%S}",
            )
        console.print(table)
    console.print(
        f"reserved for DAG {safe(res['platform_dag'])} (admins' deploys, or a grant): "
        f"{safe(', '.join(res['reserved']))}",
        highlight=False,
    )


@names_app.command("reclaim")
def names_reclaim(name: Annotated[str, typer.Argument(help="a published dataset name")]) -> None:
    """Unpublish a name from the DAG that holds it (admins only): its dataset keeps its data,
    that DAG no longer publishes it, and an admin's deploy may then publish it."""
    r = run_op(services().control.reclaim_name, me(), name)
    console.print(
        f"reclaimed {safe(r['name'])} from DAG {safe(r['dag'])} (dataset {r['dataset_uuid']} kept)",
        highlight=False,
    )
