"""What the demo prints at the end: the analytics as tables (and PNG charts, lite/charts.py),
and where every output lives with how to query it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from trace_platform.lite.demo.data import admin, rows_now, saved_rows
from trace_platform.lite.demo.plan import DemoPlan
from trace_platform.registry.deploy import version_location
from trace_platform.services import Services

AMOUNTS = {"total_supply", "balance", "stake", "total_stake"}  # base units, 18 decimals


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column in AMOUNTS or column.startswith("0x"):
        return f"{int(value) / 10**18:,.2f}"  # display only; the data stays exact
    return str(value)  # exact amounts (e.g. token_supplies) arrive as exact decimal text


def _table(title: str, rows: list[dict[str, Any]], limit: int = 12) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold")
    if not rows:
        table.add_column("(no rows)")
        return table
    for c in rows[0]:
        table.add_column(c, justify="left" if c == "account" else "right")
    step = max(1, len(rows) // limit)
    shown = rows[::step][:limit]
    if rows[-1] is not shown[-1]:
        shown.append(rows[-1])
    for r in shown:
        table.add_row(*[_cell(c, v) for c, v in r.items()])
    if len(shown) < len(rows):
        table.caption = f"{len(shown)} of {len(rows)} rows (evenly sampled)"
    return table


def analytics(svc: Services, plan: DemoPlan, out_dir: Path, console: Console) -> None:
    from trace_platform.lite.charts import holders_chart, supply_chart

    me = admin(svc)
    every = max(1, (plan.to_block - plan.from_block + 1) // 200)
    supply = saved_rows(svc, me, "token_supply", token=plan.token, every=every)
    console.print(
        f"\n[bold]Analytics[/bold] for token {plan.token}, blocks {plan.from_block}-{plan.to_block} "
        "[dim](amounts in tokens: base units ÷ 10^18; the datasets hold exact integers)[/dim]"
    )
    console.print(_table("(1) Total supply by block", supply))
    supplies = saved_rows(svc, me, "token_supplies")
    console.print(_table("    …and every token's supply, exact base units", supplies, limit=10))
    top = saved_rows(svc, me, "top_holders", token=plan.token, n=10)
    console.print(_table(f"(2) Top 10 holders at block {plan.to_block}", top, limit=10))
    history = saved_rows(svc, me, "holder_history", token=plan.token, n=5, every=every)
    accounts = sorted({r["account"] for r in history})
    pivot: dict[int, dict[str, Any]] = {}
    for r in history:
        pivot.setdefault(r["block_number"], {"block_number": r["block_number"]})[
            r["account"][:10] + "…"
        ] = r["balance"]
    console.print(
        _table(f"    …and the historic balances of the top {len(accounts)}", list(pivot.values()))
    )
    stake = saved_rows(svc, me, "validator_stake")
    console.print(_table("(3) Stake per validator (last epoch)", stake, limit=20))
    conc = saved_rows(svc, me, "staking_concentration")
    console.print(_table("    Staking concentration per epoch", conc))
    delegators = saved_rows(svc, me, "delegator_concentration")
    console.print(_table("    Delegator concentration per validator (last epoch)", delegators))
    out_dir.mkdir(parents=True, exist_ok=True)
    charts = [
        supply_chart(supply, out_dir / "supply_by_block.png", plan.token),
        holders_chart(history, out_dir / "top_holder_balances.png", plan.token),
    ]
    for c in charts:
        console.print(f"chart: [cyan]{c}[/cyan]")


def where(svc: Services, plan: DemoPlan, console: Console) -> None:
    me = admin(svc)
    table = Table("dataset", "backend", "rows", "where", title="Outputs", title_justify="left")
    table.columns[3].overflow = "fold"
    root = Path(svc.settings.object_store_root or "").resolve()
    for d in svc.control.list_datasets(me):
        rows = int(d["row_count"] or 0)
        # The current version's location, as deploy cut it.
        loc = version_location(d["org_id"], d["dataset_uuid"], d["current_version"], d["backend"])
        if d["backend"] == "parquet":
            loc = f"{root}/{loc}"
        else:
            loc = f"Postgres {loc} (view published.{d['dataset_name']})"
            if d["commits"]:  # a window: what it holds now, not what passed through it
                rows = rows_now(svc, me, d["dataset_name"])
        table.add_row(d["dataset_name"], d["backend"], f"{rows:,}", loc)
    console.print(table)
    console.print(
        "Query them (each name pinned to its current version):\n"
        '  [cyan]trace query "SELECT count(*), max(block_number) FROM blocks"[/cyan]\n'
        f"  [cyan]trace query --saved top_holders --param token={plan.token}[/cyan]\n"
        "  [cyan]trace query --list[/cyan]   (saved queries)    "
        "[cyan]trace datasets list[/cyan]"
    )
