"""`trace query`: SQL over published datasets through the Query Service."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from trace_platform.cli.control import console, fail, me, run_op, services
from trace_platform.cli.safe_text import printable, safe

if TYPE_CHECKING:
    from trace_platform.query.service import Result


def parse_params(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            fail(f"--param takes name=value (got '{pair}')")
        out[name.strip()] = value
    return out


def result_table(result: Result, title: str | None = None, limit: int = 50) -> Table:
    from trace_platform.query import formats

    cols = formats.columns(result.table)
    # Column names and values are whatever the data holds (other DAGs' operators wrote it).
    table = Table(*[safe(c["name"]) for c in cols], title=title, title_justify="left")
    numeric = {
        safe(c["name"])
        for c in cols
        if c["type"].startswith(("int", "uint", "decimal", "double", "float", "bignum"))
    }
    for c in table.columns:
        if c.header in numeric:
            c.justify = "right"
    for row in formats.rows(result.table)[:limit]:
        table.add_row(*["" if v is None else safe(v) for v in row])
    if result.table.num_rows > limit:
        table.caption = f"first {limit} of {result.table.num_rows} rows"
    return table


def query(
    sql: Annotated[str | None, typer.Argument(help="a SELECT over published datasets")] = None,
    saved_name: Annotated[
        str | None, typer.Option("--saved", help="run a saved query (trace query --list)")
    ] = None,
    param: Annotated[list[str], typer.Option("--param", help="name=value")] = [],  # noqa: B006
    fmt: Annotated[str, typer.Option("--format", help="table, csv, json or parquet")] = "table",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write here")] = None,
    export: Annotated[
        bool, typer.Option("--export", help="write the result to the object store")
    ] = False,
    max_rows: Annotated[int | None, typer.Option(min=1)] = None,
    timeout: Annotated[float | None, typer.Option(help="seconds", min=0.01)] = None,
    list_saved: Annotated[bool, typer.Option("--list", help="list saved queries")] = False,
) -> None:
    """Run SQL over published datasets (each pinned to its current version at query start)."""
    # Imported when a query runs: pyarrow and DuckDB cost every other command a second.
    from trace_platform.query import formats, saved

    if list_saved:
        t = Table("saved query", "parameters", "what it answers")
        for name in saved.names():
            q = saved.load(name)
            defaults = ", ".join(f"{k}={v}" for k, v in q.defaults.items())
            t.add_row(safe(name), safe(defaults), safe(q.description))
        console.print(t)
        return
    if (sql is None) == (saved_name is None):
        fail('give a SQL statement or --saved NAME, e.g. trace query "SELECT count(*) FROM blocks"')
    params: dict[str, Any] = parse_params(param)
    if saved_name is not None:
        q = run_op(saved.load, saved_name)
        sql, params = q.sql, run_op(q.params, params)
    assert sql is not None
    if fmt not in ("table", *formats.FORMATS):
        fail(f"--format must be table, csv, json or parquet (got '{fmt}')")
    svc, actor = services(), me()
    if export:
        out = run_op(
            svc.query.export, actor, sql, params, fmt if fmt in ("csv", "parquet") else "parquet"
        )
        console.print(f"exported {out['row_count']:,} rows to {safe(out['location'])}")
        return
    result: Result = run_op(
        svc.query.query, actor, sql, params, max_rows=max_rows, timeout_seconds=timeout
    )
    if fmt == "table":
        console.print(result_table(result, limit=max_rows or 1000))
        pinned = safe(", ".join(f"{n}@{v[:8]}" for n, v in result.plan.versions.items()))
        console.print(
            f"[dim]{result.table.num_rows} rows in {result.elapsed_ms:.0f} ms; pinned: {pinned}[/dim]"
        )
        return
    data = (
        json.dumps(result.as_json(), indent=2).encode() + b"\n"
        if fmt == "json"
        else formats.encode(result.table, fmt)
    )
    if output is not None:
        output.write_bytes(data)
        console.print(f"wrote {result.table.num_rows} rows to {safe(output)}")
    elif fmt == "parquet":
        fail("parquet is binary: give --output FILE (or use --export)")
    elif sys.stdout.isatty():
        # Shown on a terminal, not piped: the data's control characters must not act on it.
        # (A pipe or --output gets the bytes as they are.)
        sys.stdout.write(printable(data.decode("utf-8", "replace")))
    else:
        sys.stdout.buffer.write(data)
