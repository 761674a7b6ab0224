"""Property-based fuzzing of the Query Service's guard.

Hypothesis writes SQL from a small grammar of DuckDB constructs: select lists calling functions
drawn from every name `duckdb_functions()` knows (allowed or not, with postgres_scanner and httpfs
loaded as the engine loads them), casts, lambdas, COLUMNS(…), CASE, window functions, scalar and
FROM subqueries, CTEs (recursive ones too) whose names shadow datasets and catalog views, set
operations, PIVOT, and table references drawn from dataset names, CTE names, file paths,
qualified names, catalog views and table functions, with string literals holding SQL and paths.

The property: whatever the guard accepts reads no file, no setting, no table function and no
table but a dataset. It is checked without the guard's code, twice:

1. a separate, minimal walk of DuckDB's parse tree (`_independent_check`): no table function or
   SHOW as a table, no qualified table, every table a dataset or a CTE named somewhere in the
   statement, no function that reads the outside (every table function, pragma and extension
   function, and the session/settings/SQL-text ones listed in `_OUTSIDE`), no SQL value keyword
   that reads the session;
2. running it (when every name it reads is a dataset) on a DuckDB where only the datasets exist,
   as views over one-row tables, with canaries planted in a variable, three settings, a secret,
   the views' definitions and a file, external access off and the configuration locked: the
   bound plan (`json_serialize_plan`) scans nothing but the datasets' tables, running it raises
   no permission, IO or HTTP error (an attempt to reach a file or the network) and no "does not
   exist" for a table or table function (the guard's scoping wrong), and no canary comes back.
"""

from __future__ import annotations

import json
import os
import string
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trace_platform.query.guard import QueryRefused, dataset_names

DATASETS = ("blocks", "transactions", "logs")
CANARY = "CANARYc4f1"
COLUMNS = ("block_number", "gas_used", "source", "path", "x")
MAX_EXAMPLES = int(os.environ.get("TRACE_GUARD_FUZZ_EXAMPLES", "300"))

# Functions that read the world outside the statement's own values, by name: a second opinion,
# not the guard's allowlist.
_OUTSIDE = {
    "current_setting", "getvariable", "getenv", "current_database", "current_catalog",
    "current_schema", "current_schemas", "current_query", "current_query_id",
    "current_connection_id", "current_transaction_id", "txid_current", "current_user",
    "current_role", "session_user", "user", "in_search_path", "version", "nextval", "currval",
    "json_serialize_sql", "json_deserialize_sql", "json_serialize_plan",
    "json_execute_serialized_sql", "query", "query_table", "sql_auto_complete", "which_secret",
    "pg_get_viewdef", "pg_get_constraintdef", "format_type", "get_block_size", "read_text",
    "read_blob", "stats", "setseed", "write_log", "make_type",
}  # fmt: skip
_SESSION_KEYWORDS = {
    "current_catalog", "current_role", "current_schema", "current_user", "session_user", "user",
}  # fmt: skip


def _engine_like_connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(
        ":memory:",
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False},
    )
    import duckdb_extensions

    for ext in ("postgres_scanner", "httpfs"):
        duckdb_extensions.import_extension(ext, con=con)
        con.execute(f"LOAD {ext}")
    return con


def _function_catalog() -> tuple[list[str], list[str], set[str]]:
    """Every function name (for the grammar), the table functions, and the names that are not a
    scalar, aggregate or macro of the main schema (for the independent check)."""
    con = _engine_like_connection()
    try:
        rows = con.execute(
            "SELECT function_name, function_type, schema_name FROM duckdb_functions()"
        ).fetchall()
    finally:
        con.close()
    names = sorted({n for n, _, _ in rows} | _OUTSIDE)
    tables = sorted({n for n, t, _ in rows if t in ("table", "table_macro")})
    computing = {
        n.lower() for n, t, s in rows if t in ("scalar", "aggregate", "macro") and s == "main"
    }
    outside = {n.lower() for n in names if n.lower() not in computing} | _OUTSIDE
    return names, tables, outside - {"unnest"}


ALL_FUNCTIONS, TABLE_FUNCTIONS, OUTSIDE = _function_catalog()


# -- the sandbox -----------------------------------------------------------------------------
class Sandbox:
    """DuckDB with only the datasets in it, canaries everywhere else."""

    def __init__(self, tmp: Path) -> None:
        self.canary_file = tmp / "target.txt"  # its name is no secret, its content is
        self.canary_file.write_text(f"{CANARY}-file\n")
        con = _engine_like_connection()
        cols = "block_number BIGINT, gas_used BIGINT, source VARCHAR, path VARCHAR, x INTEGER"
        for name in DATASETS:
            con.execute(f"CREATE TABLE _t_{name} ({cols})")
            con.execute(
                f"INSERT INTO _t_{name} VALUES (1, 2, 'cold', ?, 3)", [str(self.canary_file)]
            )
            con.execute(
                f"CREATE VIEW {name} AS SELECT * FROM _t_{name} WHERE '{CANARY}-view' <> ''"
            )
        con.execute(f"SET VARIABLE canary = '{CANARY}-var'")
        con.execute(f"SET file_search_path = '/nonexistent/{CANARY}-fsp'")
        con.execute(f"SET home_directory = '/nonexistent/{CANARY}-home'")
        con.execute(f"SET s3_access_key_id = '{CANARY}-s3'")
        con.execute(
            f"CREATE SECRET canary_secret (TYPE s3, KEY_ID '{CANARY}-key', SECRET '{CANARY}-sec')"
        )
        con.execute("SET memory_limit = '512MB'")
        con.execute("SET threads = 1")
        con.execute("SET python_enable_replacements = false")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        self.con = con

    def plan_scans(self, sql: str) -> list[str]:
        """What the bound plan scans (empty if DuckDB cannot bind it)."""
        raw = self.con.execute("SELECT json_serialize_plan(?)", [sql]).fetchone()
        assert raw is not None
        plan = json.loads(raw[0])
        if plan.get("error"):
            return []
        scans: list[str] = []
        for node in _nodes(plan):
            if node.get("type") == "LOGICAL_GET":
                data = node.get("function_data") or {}
                table = data.get("table") if isinstance(data, dict) else None
                scans.append(f"{node.get('name')}:{table}")
        return scans

    def run(self, sql: str) -> tuple[str, Any]:
        """Runs on the connection itself (a cursor would not see its variable)."""
        timer = threading.Timer(2.0, self.con.interrupt)
        timer.start()
        try:
            rows = self.con.execute(sql).fetchmany(10_000)
            return "ok", rows
        except duckdb.Error as e:
            return type(e).__name__, str(e)
        finally:
            timer.cancel()


def _nodes(tree: Any) -> Iterator[dict[str, Any]]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with tempfile.TemporaryDirectory(prefix="trace-guard-fuzz-") as tmp:
        box = Sandbox(Path(tmp))
        try:
            yield box
        finally:
            box.con.close()


# -- the independent check -------------------------------------------------------------------
_PARSER = duckdb.connect(":memory:")


def _independent_check(sql: str, tables: set[str]) -> None:
    raw = _PARSER.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    assert raw is not None
    tree = json.loads(raw[0])
    assert not tree.get("error"), "accepted, yet DuckDB cannot serialize it as one SELECT"
    assert len(tree["statements"]) == 1
    nodes = list(_nodes(tree))
    cte_names = {
        str(entry["key"]).lower()
        for node in nodes
        for entry in (node.get("cte_map") or {}).get("map", [])
        if isinstance(node.get("cte_map"), dict)
    }
    for node in nodes:
        kind = node.get("type")
        assert kind not in ("TABLE_FUNCTION", "SHOW_REF"), f"accepted a {kind}"
        if kind == "BASE_TABLE":
            assert not node.get("schema_name") and not node.get("catalog_name"), node
            name = str(node.get("table_name")).lower()
            assert name in tables or name in cte_names, f"accepted table {name!r}"
        if "function_name" in node:
            fn = str(node["function_name"]).lower()
            assert fn not in OUTSIDE, f"accepted function {fn!r}"
        if node.get("class") == "COLUMN_REF":
            parts = [str(p).lower() for p in node.get("column_names", [])]
            assert not (len(parts) == 1 and parts[0] in _SESSION_KEYWORDS), parts
            assert not (parts[:1] == ["alias"] and set(parts[1:2]) & _SESSION_KEYWORDS), parts


# -- the grammar -----------------------------------------------------------------------------
CTE_NAMES = ("c1", "c2", "blocks", "pg_settings", "duckdb_settings", "sqlite_master", "r")
CATALOG_VIEWS = ("pg_settings", "sqlite_master", "duckdb_tables", "pg_class", "duckdb_views")
QUALIFIED = (
    "main.blocks", "memory.main.blocks", "system.main.duckdb_settings", "pg_catalog.pg_settings",
    "information_schema.tables", "trace_pg.public.task_status", "temp.main.x", "\"main\".blocks",
)  # fmt: skip
PATHS = ("'/etc/passwd'", "'x.parquet'", "'s3://bucket/x.csv'", "'https://example.com/x.csv'")
TYPES = (
    "INTEGER", "VARCHAR", "DOUBLE", "JSON", "INT[]", "DECIMAL(10, 2)", "STRUCT(a INT)",
    "MAP(VARCHAR, INT)", "UUID", "BLOB", "INTEGER", "VARCHAR", "my_type", "main.duckdb_settings",
)  # fmt: skip
PURE = (
    "lower", "upper", "length", "concat", "coalesce", "sum", "count", "max", "abs", "round",
    "list_value", "string_agg", "hash", "md5", "regexp_replace", "format", "list_aggr", "typeof",
    "to_json", "greatest", "array_to_string", "nullif", "printf", "strlen",
)  # fmt: skip
# Calls that bind whatever their arguments are, so ordinary statements mostly run.
CLEAN_CALLS = (
    "lower(CAST({0} AS VARCHAR))", "upper(CAST({0} AS VARCHAR))", "length(CAST({0} AS VARCHAR))",
    "concat({0}, {1})", "hash({0})", "md5(CAST({0} AS VARCHAR))", "typeof({0})", "to_json({0})",
    "coalesce({0}, NULL)", "list_value({0})", "format('{{}}-{{}}', {0}, {1})", "nullif({0}, {0})",
    "regexp_replace(CAST({0} AS VARCHAR), 'a', 'b')", "strlen(CAST({0} AS VARCHAR))",
    "[{0}, {0}][1]", "struct_extract({{'k': {0}}}, 'k')", "concat_ws(',', {0}, {1})", "greatest({0}, {0})",
)  # fmt: skip
HOSTILE = (
    "current_setting", "getvariable", "read_text", "query", "json_serialize_sql", "version",
    "pg_get_viewdef", "current_database", "which_secret", "postgres_scan", "json_serialize_plan",
    "sql_auto_complete", "query_table", "duckdb_settings", "read_csv", "glob", "format_type",
)  # fmt: skip
SQL_STRINGS = (
    "'SELECT * FROM duckdb_settings()'", "'threads'", "'memory_limit'", "'canary'",
    "'duckdb_settings'", "'current_setting'", "'sum'", "'host=127.0.0.1 port=1'",
    "'SELECT * FROM read_text(''/etc/passwd'')'", "'%Y-%m'", "'s3_access_key_id'",
)  # fmt: skip
_quote = "'{}'".format
SAFE_TYPES = ("INTEGER", "VARCHAR", "DOUBLE", "JSON", "INT[]", "DECIMAL(10, 2)", "UUID")
SAFE_AGGREGATES = ("'sum'", "'max'", "'string_agg'")
WINDOW = ("sum", "count", "max", "min", "avg", "row_number", "rank", "lag", "first_value")
ODD_COLUMNS = ("user", "current_schema", "alias.current_user", "current_date", "t.user")


class Grammar:
    """Strategies for one statement. An ordinary statement draws only dataset names, CTE names
    (shadowing datasets and catalog views) and computing functions; a hostile one draws from
    everything, so roughly half the statements reach the engine."""

    def __init__(self, hostile: bool) -> None:
        self.hostile = hostile
        # Each strategy is built once and drawn from many times: building (and hypothesis's
        # validating) a fresh tree of strategies on every draw was nearly all of the fuzz's time.
        self._selects: dict[int, st.SearchStrategy[str]] = {}
        self._expressions: dict[tuple[int, int], st.SearchStrategy[str]] = {}
        self._tables: dict[int, st.SearchStrategy[str]] = {}
        pick = st.sampled_from
        if hostile:
            self.functions = st.one_of(pick(PURE), pick(ALL_FUNCTIONS), pick(HOSTILE))
            self.windows = st.one_of(pick(WINDOW), pick(ALL_FUNCTIONS), pick(HOSTILE))
            self.columns = st.one_of(pick(COLUMNS), pick(ODD_COLUMNS))
            self.types = pick(TYPES)
            self.collations = pick(("nocase", "nocase.noaccent", "evil"))
            self.aggregates = pick(SAFE_AGGREGATES + SQL_STRINGS)
            self.forms = pick(("plain", "plain", "main", "pg_catalog", "method"))
        else:
            self.functions = pick(PURE)
            self.windows = pick(WINDOW)
            self.columns = pick(COLUMNS)
            self.types = pick(SAFE_TYPES)
            self.collations = pick(("nocase", "nocase.noaccent"))
            self.aggregates = pick(SAFE_AGGREGATES)
            self.forms = st.just("plain")
        self.literals = st.one_of(
            st.integers(-3, 5).map(str),
            pick(SQL_STRINGS + PATHS),
            st.text(string.ascii_letters + "%_ ", max_size=6).map(_quote),
            pick(("NULL", "[1, 2]", "{'a': 1}")),
        )

    def call(self, args: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        @st.composite
        def build(draw: st.DrawFn) -> str:
            if not self.hostile:
                template = draw(st.sampled_from(CLEAN_CALLS))
                return template.format(draw(args), draw(args))
            fn = draw(self.functions)
            shown = fn if fn.replace("_", "").isalnum() else f'"{fn}"'
            params = draw(st.lists(args, max_size=3))
            form = draw(self.forms)
            if form == "method" and params:
                return f"({params[0]}).{shown}({', '.join(params[1:])})"
            prefix = {"main": "main.", "pg_catalog": "pg_catalog."}.get(form, "")
            return f"{prefix}{shown}({', '.join(params)})"

        return build()

    def expressions(
        self, queries: st.SearchStrategy[str] | None, depth: int = 3
    ) -> st.SearchStrategy[str]:
        key = (id(queries), depth)  # queries: None or one of self._selects, kept alive there
        if key not in self._expressions:
            self._expressions[key] = self._build_expressions(queries, depth)
        return self._expressions[key]

    def _build_expressions(
        self, queries: st.SearchStrategy[str] | None, depth: int
    ) -> st.SearchStrategy[str]:
        leaf = st.one_of(self.literals, self.columns)
        if depth == 0:
            return leaf
        inner = self.expressions(queries, depth - 1)
        options = [
            self.call(inner),
            st.builds(lambda e, t: f"CAST({e} AS {t})", inner, self.types),
            st.builds(lambda e: f"list_transform([1, 2], x -> {e})", inner),
            st.builds(lambda f: f"list_aggr([1, 2], {f})", self.aggregates),
            st.builds(lambda a, b, c: f"CASE WHEN {a} THEN {b} ELSE {c} END", inner, inner, inner),
            st.builds(
                lambda f, a, o: f"{f}({a}) OVER (ORDER BY {o})",
                self.windows,
                inner,
                inner,
            ),
            st.builds(
                lambda a, op, b: f"({a} {op} {b})",
                inner,
                st.sampled_from(("+", "||", "=", "<", "AND", "LIKE")),
                inner,
            ),
            st.builds(lambda e, c: f"{e} COLLATE {c}", inner, self.collations),
        ]
        if queries is not None:
            options.append(queries.map(lambda q: f"({q})"))
            options.append(queries.map(lambda q: f"EXISTS ({q})"))
        return st.one_of(leaf, *options)

    def tables(self, queries: st.SearchStrategy[str] | None) -> st.SearchStrategy[str]:
        if id(queries) not in self._tables:
            self._tables[id(queries)] = self._build_tables(queries)
        return self._tables[id(queries)]

    def _build_tables(self, queries: st.SearchStrategy[str] | None) -> st.SearchStrategy[str]:
        base = st.one_of(st.sampled_from(DATASETS), st.sampled_from(CTE_NAMES))
        if self.hostile:
            args = st.lists(
                st.one_of(st.sampled_from(SQL_STRINGS + PATHS), self.literals), max_size=2
            )
            base = st.one_of(
                base,
                st.sampled_from(CATALOG_VIEWS + QUALIFIED + PATHS),
                st.builds(
                    lambda f, a: f'"{f}"({", ".join(a)})', st.sampled_from(TABLE_FUNCTIONS), args
                ),
                st.sampled_from(
                    (
                        "(SHOW TABLES)",
                        "(SUMMARIZE blocks)",
                        "(VALUES (1), (2)) v(x)",
                        "(PIVOT blocks ON source IN ('cold') USING sum(gas_used))",
                        "duc\u212adb_views",
                    )
                ),
            )
        if queries is None:
            return base
        return st.one_of(
            base,
            queries.map(lambda q: f"({q}) AS s"),
            st.builds(lambda a, b: f"{a} AS t JOIN {b} AS u ON true", base, base),
        )

    def select(self, depth: int) -> st.SearchStrategy[str]:
        if depth in self._selects:
            return self._selects[depth]

        @st.composite
        def build(draw: st.DrawFn) -> str:
            inner = self.select(depth - 1) if depth > 0 else None
            exprs = self.expressions(inner)
            items = draw(st.lists(exprs, min_size=1, max_size=3))
            if draw(st.booleans()):
                items.append(
                    draw(st.sampled_from(("*", "COLUMNS(c -> c LIKE 'b%')", "COLUMNS(*)")))
                )
            sql = f"SELECT {', '.join(items)} FROM {draw(self.tables(inner))}"
            if draw(st.booleans()):
                sql += f" WHERE {draw(exprs)}"
            if draw(st.booleans()):
                sql += f" QUALIFY {draw(exprs)}"
            if draw(st.booleans()):
                sql += f" ORDER BY {draw(exprs)}"
            return sql + " LIMIT 5"

        self._selects[depth] = build()
        return self._selects[depth]


GRAMMARS = {hostile: Grammar(hostile) for hostile in (False, True)}


@st.composite
def statements(draw: st.DrawFn) -> str:
    g = GRAMMARS[draw(st.booleans())]
    body = draw(g.select(depth=1))
    shapes = ("plain", "cte", "cte", "recursive", "union") + (("other",) if g.hostile else ())
    shape = draw(st.sampled_from(shapes))
    if shape == "cte":
        ctes = draw(
            st.lists(
                st.builds(lambda n, q: f"{n} AS ({q})", st.sampled_from(CTE_NAMES), g.select(0)),
                min_size=1,
                max_size=3,
                unique_by=lambda s: s.split(" ")[0],
            )
        )
        return f"WITH {', '.join(ctes)} {body}"
    if shape == "recursive":
        name = draw(st.sampled_from(CTE_NAMES))
        anchor_from = draw(g.tables(None))
        step_from = draw(st.sampled_from((name, name, *CATALOG_VIEWS, *DATASETS)))
        return (
            f"WITH RECURSIVE {name} AS (SELECT 1 AS n FROM {anchor_from} UNION ALL "
            f"SELECT n + 1 FROM {step_from} WHERE n < 3) {body}"
        )
    if shape == "union":
        return f"({body}) UNION ALL ({draw(g.select(depth=0))})"
    if shape == "other":
        return draw(
            st.sampled_from(
                (
                    "SET threads = 1",
                    "CALL duckdb_settings()",
                    "PRAGMA database_list",
                    f"{body}; SELECT 1",
                    "COPY blocks TO '/tmp/x.csv'",
                    f"EXPLAIN {body}",
                )
            )
        )
    return body


# -- the property ----------------------------------------------------------------------------
def check(sql: str, box: Sandbox, stats: Counter[str]) -> None:
    try:
        names = dataset_names(sql)
    except QueryRefused:
        stats["refused"] += 1
        return
    stats["accepted"] += 1
    readable = set(DATASETS)
    try:
        assert dataset_names(sql, DATASETS) == names
        assert names <= readable
    except QueryRefused:
        # A name that is no dataset: the registry answers 404 and nothing runs. Still, no
        # catalog view may pass for a dataset, and the rest must hold.
        assert not names <= readable
        assert not {n for n in names if n.startswith(("pg_", "duckdb_", "sqlite_"))}, names
        _independent_check(sql, readable | names)
        return
    _independent_check(sql, readable)
    scans = box.plan_scans(sql)
    assert all(s in {f"seq_scan:_t_{d}" for d in DATASETS} for s in scans), scans
    outcome, detail = box.run(sql)
    stats["ran"] += 1
    stats[outcome] += 1
    assert outcome not in ("PermissionException", "IOException", "HTTPException"), detail
    if outcome == "CatalogException":
        assert "Table with name" not in detail and "Table Function" not in detail, detail
        stats[str(detail).splitlines()[0][:100]] += 1
    assert CANARY not in str(detail), detail


def test_the_guard_lets_nothing_out(sandbox: Sandbox) -> None:
    stats: Counter[str] = Counter()

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(sql=statements())
    @example(sql="SELECT * FROM blocks")
    @example(
        sql="WITH RECURSIVE pg_settings AS (SELECT name FROM pg_settings UNION ALL "
        "SELECT name FROM pg_settings WHERE false) SELECT * FROM pg_settings"
    )
    @example(sql="WITH duc\u212adb_views AS (SELECT 1) SELECT * FROM duckdb_views")
    @example(sql="SELECT alias.current_schema, user FROM blocks")
    @example(sql="SELECT list_aggr([1], 'current_setting')")
    @example(sql="SELECT read_text(path) FROM blocks")
    def prop(sql: str) -> None:
        check(sql, sandbox, stats)

    prop()
    print(f"guard fuzz: {dict(stats)}")
    # The grammar must keep reaching the engine, or the property proves little.
    assert stats["accepted"] >= MAX_EXAMPLES // 10, stats
    assert stats["ran"] >= MAX_EXAMPLES // 10, stats
    assert stats["ok"] >= MAX_EXAMPLES // 50, stats


def test_the_sandbox_catches_what_the_guard_must_stop(sandbox: Sandbox) -> None:
    """The checks fail on the leaks they are there to catch (so a pass means something)."""
    for sql in (
        "SELECT getvariable('canary')",
        "SELECT current_setting('file_search_path')",
        "SELECT * FROM duckdb_secrets()",
        "SELECT sql FROM duckdb_views() WHERE view_name = 'blocks'",
        "SELECT * FROM pg_settings WHERE name = 's3_access_key_id'",
    ):
        outcome, detail = sandbox.run(sql)
        assert outcome == "ok" and CANARY in str(detail), sql
    outcome, _ = sandbox.run(f"SELECT * FROM read_text('{sandbox.canary_file}')")
    assert outcome == "PermissionException"
    # External access off does not stop postgres_scanner from dialling out: the guard must.
    outcome, _ = sandbox.run("SELECT * FROM postgres_scan('host=127.0.0.1 port=1', 'p', 't')")
    assert outcome == "IOException"
    assert sandbox.plan_scans("SELECT * FROM pg_settings") != []
    assert not all(s.startswith("seq_scan:_t_") for s in sandbox.plan_scans("FROM pg_settings"))
    for sql in (
        "SELECT * FROM read_csv('x.csv')",
        "SELECT * FROM main.blocks",
        "SELECT * FROM pg_settings",
        "SELECT current_setting('threads')",
        "SELECT alias.user",
    ):
        with pytest.raises(AssertionError):
            _independent_check(sql, set(DATASETS))
