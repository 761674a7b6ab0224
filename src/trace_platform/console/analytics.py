"""The Monad analytics as a console page, `/console/analytics`: a token's supply by block, its
top holders and their balances over the blocks, and staking concentration per period.

Each is the platform's saved query (query/saved/*.sql: what `trace query --saved` and the
demo's report run), through the Query Service as the logged-in user and pinned to the platform's
DAG, as `POST /v1/query` with `saved` runs it: a dataset the user may not read, or that no demo
run has produced yet, makes its analytic "not available" (the Query Service's reason) while the
others still show. Tables and SVG charts are drawn on the server; the parameters are a GET
form."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from trace_platform.console.svg import chart_svg
from trace_platform.console.web import ConsoleRoute, attempt, render
from trace_platform.identity import Actor
from trace_platform.query import pinned
from trace_platform.services import Services

TOKEN = re.compile(r"0x[0-9a-f]{40}")
POINTS = 200  # blocks drawn per chart unless the form asks for a step
BARS = 200  # bars drawn at most (chart_svg's default)
MAX_N = 50  # top holders at most
HISTORY_N = 5  # holders whose balances are drawn over the blocks (one small chart each)


@dataclass
class Panel:
    """One analytic as shown: its rows (the Query Service's JSON answer) and charts, or why it
    is not available."""

    result: dict[str, Any] | None = None
    charts: list[tuple[str, Markup]] = field(default_factory=list)
    error: str | None = None

    def rows(self) -> list[dict[str, Any]]:
        if self.result is None:
            return []
        names = [c["name"] for c in self.result["columns"]]
        return [dict(zip(names, row, strict=True)) for row in self.result["rows"]]

    def chart(
        self,
        caption: str,
        x: str,
        y: str,
        kind: str,
        rows: list[dict[str, Any]] | None = None,
    ) -> None:
        """A chart of `rows` (default: the panel's), if any row has a number in `y`: a line
        of every row, bars of the first BARS."""
        rows = self.rows() if rows is None else rows
        svg = chart_svg(rows, x, y, kind, len(rows) if kind == "line" else BARS)
        if svg is not None:
            self.charts.append((caption, svg))


def _attempt(build: Callable[[], Panel]) -> Panel:
    """The panel, or the reason the Query Service (or a parameter) refused it."""
    panel, error = attempt(build)
    return panel if panel is not None else Panel(error=error)


def _int(text: str, default: int, lo: int, hi: int) -> int:
    try:
        value = int(text)
    except ValueError:
        return default
    return min(max(value, lo), hi)


def _pivot(history: Panel) -> dict[str, Any]:
    """holder_history's (block, account, balance) rows as one row per block, a column per
    account, in the results table's shape."""
    rows = history.rows()
    accounts = list(dict.fromkeys(r["account"] for r in rows))
    by_block: dict[Any, dict[str, Any]] = {}
    for r in rows:
        by_block.setdefault(r["block_number"], {})[r["account"]] = r["balance"]
    assert history.result is not None
    return {
        "columns": [{"name": "block_number"}] + [{"name": a} for a in accounts],
        "rows": [[b] + [v.get(a) for a in accounts] for b, v in by_block.items()],
        "row_count": len(by_block),
        "elapsed_ms": history.result["elapsed_ms"],
    }


def router(services: Services, user: Callable[..., Actor]) -> APIRouter:
    qs = services.query
    r = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

    def saved(me: Actor, name: str, **params: Any) -> Panel:
        # The Query Service's row cap, as for /v1/query: ~POINTS blocks per holder fit in it.
        return Panel(pinned.saved_query(qs, me, name, params).as_json())

    def auto_step(me: Actor) -> int:
        """A step giving about POINTS blocks over the synced range (1 if it cannot be read:
        the panels then say why)."""
        out, _ = attempt(lambda: pinned.saved_query(qs, me, "synced_blocks", {}))
        if out is None:
            return 1
        lo, hi = (out.table.column(i)[0].as_py() for i in (0, 1))
        return 1 if lo is None or hi is None else max(1, -(-(hi - lo + 1) // POINTS))

    @r.get("/console/analytics")
    def analytics_page(
        request: Request,
        me: Actor = Depends(user),
        token: str = "",
        n: str = "10",
        every: str = "",
    ) -> HTMLResponse:
        top_n = _int(n, 10, 1, MAX_N)
        supplies = _attempt(lambda: saved(me, "token_supplies"))
        known = [row["token_address"] for row in supplies.rows()]
        token = token.strip().lower() or (known[0] if known else "")
        step = _int(every, 0, 1, 10**9) if every.strip() else auto_step(me)

        def about_token(build: Callable[[], Panel]) -> Panel:
            if not TOKEN.fullmatch(token):
                why = "give a token address (0x and 40 hex digits)"
                return Panel(error=supplies.error if not token and supplies.error else why)
            return _attempt(build)

        def supply() -> Panel:
            p = saved(me, "token_supply", token=token, every=step)
            p.chart("Total supply by block", "block_number", "total_supply", "line")
            return p

        def holders() -> Panel:
            p = saved(me, "top_holders", token=token, n=top_n)
            p.chart(f"Balances of the top {top_n} holders", "account", "balance", "bar")
            return p

        def history() -> Panel:
            p = saved(me, "holder_history", token=token, n=min(top_n, HISTORY_N), every=step)
            rows = p.rows()
            for account in dict.fromkeys(r["account"] for r in rows):
                mine = [r for r in rows if r["account"] == account]
                p.chart(f"Balance of {account}", "block_number", "balance", "line", mine)
            p.result = _pivot(p)
            return p

        def staking() -> Panel:
            p = saved(me, "staking_concentration")
            p.chart("HHI (sum of squared stake shares) per period", "window_end", "hhi", "line")
            p.chart("Nakamoto coefficient per period", "window_end", "nakamoto_coefficient", "bar")
            return p

        return render(
            request,
            "analytics.html",
            me=me,
            token=token,
            tokens=known,
            n=top_n,
            max_n=MAX_N,
            every=step,
            supply=about_token(supply),
            holders=about_token(holders),
            history=about_token(history),
            staking=_attempt(staking),
        )

    return r
