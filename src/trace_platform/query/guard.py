"""What a user's SQL may touch: one SELECT over dataset names, nothing else.

The statement is parsed by DuckDB itself (`json_serialize_sql`), so what is checked is what would
run. Table functions (read_parquet, postgres_query, glob, …) and qualified names are refused
outright; the engine's own sandbox (external access off, config locked) is the second wall."""

from __future__ import annotations

import functools
import json
import threading
from typing import Any

import duckdb

from trace_platform.dispatcher.errors import Invalid

# Scalar functions that read configuration or the outside world.
DENIED_FUNCTIONS = {"current_setting", "getenv", "getvariable", "read_text", "read_blob"}

_parser = duckdb.connect(":memory:")  # parsing only; never sees data
_parser_lock = threading.Lock()


class QueryRefused(Invalid):
    code = "query_refused"


def _walk(node: Any, out: dict[str, set[str]], ctes: frozenset[str]) -> None:
    """Collects what a parse tree reads, with CTE names in scope exactly where SQL puts them:
    a CTE's body sees only the CTEs before it (and itself, if recursive); the rest of its
    statement sees them all; nothing outside that statement does. So a CTE cannot hide a
    table read anywhere else (`WITH duckdb_databases AS (SELECT * FROM duckdb_databases)`)."""
    if isinstance(node, list):
        for item in node:
            _walk(item, out, ctes)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind == "RECURSIVE_CTE_NODE" and node.get("cte_name"):
        ctes = ctes | {str(node["cte_name"]).lower()}
    cte_map = node.get("cte_map")
    if isinstance(cte_map, dict) and cte_map.get("map"):
        for entry in cte_map["map"]:
            _walk(entry.get("value"), out, ctes)  # the body: earlier CTEs only
            ctes = ctes | {str(entry.get("key", "")).lower()}
    if kind == "TABLE_FUNCTION":
        fn = (node.get("function") or {}).get("function_name", "?")
        out["table_functions"].add(fn)
    elif kind == "SHOW_REF":  # (SHOW …) / (DESCRIBE …) as a table: catalog contents
        out["table_functions"].add("SHOW/DESCRIBE")
    elif kind == "BASE_TABLE":
        name = node.get("table_name", "")
        if node.get("catalog_name") or node.get("schema_name"):
            parts = [node.get("catalog_name"), node.get("schema_name"), name]
            out["qualified"].add(".".join(p for p in parts if p))
        elif name.lower() not in ctes:
            out["tables"].add(name)
    if node.get("class") == "FUNCTION" and node.get("function_name") in DENIED_FUNCTIONS:
        out["denied"].add(node["function_name"])
    for key, value in node.items():
        if key != "cte_map":
            _walk(value, out, ctes)


def dataset_names(sql: str) -> set[str]:
    """The dataset names a statement reads (lower-cased), or QueryRefused saying why not."""
    return set(_dataset_names(sql))


@functools.lru_cache(maxsize=1024)  # a pure function of the text; dashboards repeat queries
def _dataset_names(sql: str) -> frozenset[str]:
    if not sql.strip():
        raise QueryRefused("empty query")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryRefused(f"bad SQL: {_first_line(e)}") from None
    if len(statements) != 1:
        raise QueryRefused(f"one statement per query (got {len(statements)})")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise QueryRefused(
            f"only SELECT is allowed (got {statements[0].type.name}): "
            "the Query Service never writes"
        )
    with _parser_lock:
        raw = _parser.execute("SELECT json_serialize_sql($1)", [sql]).fetchone()
    assert raw is not None
    tree = json.loads(raw[0])
    if tree.get("error"):
        message = tree.get("error_message", "cannot parse")
        if "Only SELECT" in message:  # e.g. PRAGMA, which parses as a rewritten SELECT
            raise QueryRefused("only SELECT is allowed: the Query Service never writes")
        raise QueryRefused(f"bad SQL: {message}")
    found: dict[str, set[str]] = {
        k: set() for k in ("tables", "qualified", "table_functions", "denied")
    }
    _walk(tree["statements"], found, frozenset())
    if found["table_functions"]:
        fns = ", ".join(sorted(found["table_functions"]))
        raise QueryRefused(
            f"table functions are not allowed ({fns}): read datasets by name, "
            "e.g. SELECT … FROM blocks"
        )
    if found["qualified"]:
        raise QueryRefused(
            f"qualified names are not allowed ({', '.join(sorted(found['qualified']))}): "
            "refer to published datasets by their plain name"
        )
    if found["denied"]:
        raise QueryRefused(f"function not allowed: {', '.join(sorted(found['denied']))}")
    return frozenset(t.lower() for t in found["tables"])


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
