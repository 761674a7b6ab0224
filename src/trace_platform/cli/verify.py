"""`trace verify`: the published analytics against the chain itself, at sampled blocks."""

from __future__ import annotations

import random
from typing import Annotated, Any, NoReturn

import typer
from rich.table import Table

from trace_platform.chain import RpcError
from trace_platform.cli.control import console, me, services
from trace_platform.cli.safe_text import safe
from trace_platform.config import get_settings
from trace_platform.errors import TraceError
from trace_platform.registry.reserved import PLATFORM_DAG
from trace_platform.verify import CannotVerify, Node, Outcome, connect, resolve_target, verify_all

CANNOT = 2  # exit code when nothing could be compared (1 is a mismatch)


def _cannot(message: str) -> NoReturn:
    console.print(f"[red]error:[/red] {safe(message)}")
    raise typer.Exit(CANNOT)


def outcome_table(outcomes: list[Outcome], title: str) -> Table:
    table = Table("analytic", "compared", "blocks", "checked", "matched", "result", title=title)
    for o in outcomes:
        if o.skipped:
            result = f"[yellow]skipped[/yellow]: {safe(o.skipped)}"
        elif o.checked == 0:
            result = "[yellow]nothing to check[/yellow]"
        else:
            result = (
                "[green]match[/green]" if o.ok else f"[red]{len(o.mismatches)} mismatched[/red]"
            )
        table.add_row(
            safe(o.analytic),
            safe(o.compared),
            str(len(o.blocks)),
            str(o.checked),
            str(o.matched),
            result,
        )
    for c in ("blocks", "checked", "matched"):
        next(col for col in table.columns if col.header == c).justify = "right"
    return table


def verify(
    rpc_url: Annotated[
        str | None,
        typer.Option(help="the node to ask (default: the running devnet, else the last demo's)"),
    ] = None,
    token: Annotated[
        str | None, typer.Option(help="the ERC20 token (default: the last demo's)")
    ] = None,
    samples: Annotated[
        int, typer.Option(min=2, help="blocks to check, spread over the synced range")
    ] = 8,
    seed: Annotated[int | None, typer.Option(help="the sampling seed (default: random)")] = None,
    holders: Annotated[int, typer.Option(min=1, help="top holders to check")] = 5,
) -> None:
    """Check the published analytics against the chain itself: token supply (totalSupply()),
    top holders and their history (balanceOf()) and validator stake (the staking contract's
    views) at sampled blocks. Exits 1 on any mismatch, 2 when nothing could be checked."""
    try:
        target = resolve_target(get_settings().home, rpc_url, token)
        rpc = connect(target)
    except CannotVerify as e:
        _cannot(str(e))
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    svc, actor = services(), me()

    from trace_platform.query import pinned  # DuckDB: only for the command that queries

    def query(sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        # What verify reads must be the platform DAG's: never a squatter's numbers.
        out = pinned.query(
            svc.query, actor, sql, params, producer=PLATFORM_DAG, what="trace verify"
        ).as_json()
        cols = [c["name"] for c in out["columns"]]
        return [dict(zip(cols, r, strict=True)) for r in out["rows"]]

    try:
        with console.status("asking the Query Service and the node…"):
            (lo, hi), outcomes = verify_all(query, Node(rpc), target.token, samples, seed, holders)
    except CannotVerify as e:
        _cannot(str(e))
    except RpcError as e:
        _cannot(
            f"the node at {target.rpc_url} could not answer: {e} (state at past blocks needs "
            "an archive node)"
        )
    except TraceError as e:
        _cannot(e.message)
    finally:
        rpc.close()
    console.print(
        f"Verifying blocks {lo}-{hi} against {safe(target.rpc_url)} ({safe(target.source)}), "
        f"token {safe(target.token or '-')}, {samples} samples, seed {seed} (repeat with --seed {seed})",
        highlight=False,
    )
    console.print(outcome_table(outcomes, "trace verify"))
    wrong = [m for o in outcomes for m in o.mismatches]
    for m in wrong:
        console.print(f"[red]mismatch[/red] {safe(m.describe())}", highlight=False)
    if wrong:
        raise typer.Exit(1)
    if not any(o.checked for o in outcomes):
        _cannot("nothing was checked (every analytic was skipped)")
    console.print("[green]every checked value matches the node[/green]")
