"""What the Query Service's guard lets through: dataset names only, read by one SELECT that
computes with allowlisted functions."""

from __future__ import annotations

import duckdb
import pytest

from trace_platform.query import guard, saved
from trace_platform.query.guard import ALLOWED_FUNCTIONS, QueryRefused, dataset_names


def refusal(sql: str, datasets: list[str] | None = None) -> str:
    with pytest.raises(QueryRefused) as e:
        dataset_names(sql, datasets)
    assert e.value.status_code == 422  # the guard's error keeps its HTTP mapping
    return str(e.value.message)


def test_names_come_from_every_clause_but_not_from_ctes() -> None:
    sql = """
      WITH recent AS (SELECT * FROM Blocks WHERE block_number > $from)
      SELECT r.block_number, (SELECT count(*) FROM logs l WHERE l.block_number = r.block_number)
      FROM recent r ASOF LEFT JOIN token_supply s ON r.block_number >= s.block_number
      WHERE r.block_number IN (SELECT block_number FROM transactions)
      QUALIFY row_number() OVER (PARTITION BY r.block_number ORDER BY (SELECT 1 FROM receipts)) = 1
      ORDER BY (SELECT max(block_number) FROM traces)
    """
    assert dataset_names(sql) == {
        "blocks",
        "logs",
        "token_supply",
        "transactions",
        "receipts",
        "traces",
    }


# -- the queries the platform itself runs --------------------------------------------------------
INTEGRATION_QUERIES = [  # tests/integration/test_query.py, test_query_limits.py, hostile inputs
    "SELECT count(*), min(block_number), max(block_number) FROM blocks",
    "SELECT sum(value) FROM transactions WHERE block_number = 7",
    "WITH t AS (SELECT * FROM transactions) SELECT count(*) FROM t JOIN blocks USING (block_number)",
    "SELECT count(*), min(block_number), max(block_number) FROM blocks_hot",
    "SELECT source, count(*), min(block_number), max(block_number) FROM blocks GROUP BY 1 ORDER BY 1",
    "SELECT count(DISTINCT block_number), count(*) FROM blocks",
    "SELECT count(*), sum(h.gas_used) FROM blocks_hot h JOIN transactions t USING (block_number)",
    "SELECT source, count(*) FROM blocks GROUP BY 1 ORDER BY 1",
    "SELECT * FROM blocks LIMIT 1",
    "WITH x AS (SELECT 1) SELECT * FROM blocks_hot LIMIT 1",
    "SELECT 1 FROM blocks",
    "SELECT count(*) FROM blocks",
    "SELECT count(*), min(source) FROM blocks",
    "SELECT no_such_column FROM blocks",
    "SELECT * FROM no_such_dataset",
    "SELECT count(*) FROM blocks JOIN transactions USING (block_number)",
    "SELECT * FROM transactions",
    "SELECT count(*) FROM blocks a, blocks b, blocks c, blocks d, blocks e, blocks f",
    "SELECT block_number, block_hash, gas_used FROM blocks ORDER BY 1 LIMIT 3",
    "SELECT count(*), max(block_number) FROM blocks",
    "SELECT block_number, block_number * 2 AS twice FROM blocks WHERE block_number < 300",
    "SELECT count(*) AS n, max(block_number) AS top FROM mallory_blocks",
    "SELECT sum(hash(a.block_number * b.block_number + c.block_number)) FROM blocks a, blocks b, blocks c",
    "SELECT len(generate_series(1, 60000000))",
    "SELECT repeat('x', 30000000) AS s",
    "SELECT length($s) AS n",
    "SELECT 41 + 1",
    "SELECT 1 AS one",
]
BENCH_QUERIES = [  # bench/query_bench.py (besides the saved queries)
    "SELECT count(*), sum(t.gas_used) FROM blocks_hot h JOIN transactions t USING (block_number)",
]


@pytest.mark.parametrize("sql", INTEGRATION_QUERIES + BENCH_QUERIES)
def test_the_platforms_own_queries_pass(sql: str) -> None:
    dataset_names(sql)


def test_every_saved_query_parses_and_declares_its_parameters() -> None:
    assert set(saved.names()) >= {"token_supply", "top_holders", "holder_history"}
    for name in saved.names():
        q = saved.load(name)
        assert q.description, name
        assert dataset_names(q.sql), name
        filled = {k: "0xab" if v == "" else v for k, v in q.defaults.items()}
        assert set(q.params(filled)) <= set(q.defaults)


def test_an_unknown_name_is_left_to_the_registry() -> None:
    # The registry answers 404 for these; the guard only says what is read.
    assert dataset_names("SELECT * FROM '/etc/passwd'") == {"/etc/passwd"}
    assert dataset_names("SELECT * FROM no_such_dataset") == {"no_such_dataset"}


def test_the_caller_may_pass_the_dataset_names() -> None:
    sql = "WITH t AS (SELECT * FROM Transactions) SELECT * FROM t JOIN blocks USING (block_number)"
    assert dataset_names(sql, ["blocks", "transactions"]) == {"blocks", "transactions"}
    assert "'transactions' is not a dataset name" in refusal(sql, ["blocks"])
    assert "'/etc/passwd' is not a dataset name" in refusal("SELECT * FROM '/etc/passwd'", [])
    # A dataset that happens to be named like a catalog view is the caller's to allow.
    assert dataset_names("SELECT * FROM pg_tables", ["pg_tables"]) == {"pg_tables"}


# -- CTE scope -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sql",
    [
        # A CTE declared in a subquery must not hide the outer (system) table.
        "SELECT path FROM blocks, duckdb_databases WHERE EXISTS "
        "(WITH duckdb_databases AS (SELECT 1) SELECT 1)",
        # A CTE's own body does not see itself (unless recursive).
        "WITH duckdb_databases AS (SELECT * FROM duckdb_databases) SELECT * FROM duckdb_databases",
        # A CTE sees only the CTEs before it.
        "WITH b AS (SELECT * FROM duckdb_settings), duckdb_settings AS (SELECT 1) SELECT * FROM b",
        # A recursive CTE's anchor reads the catalog's table of that name, not itself.
        "WITH RECURSIVE pg_settings AS (SELECT name FROM pg_settings UNION ALL "
        "SELECT name FROM pg_settings WHERE false) SELECT * FROM pg_settings",
        # Under WITH RECURSIVE, a CTE that is not a UNION of anchor and recursive part is plain.
        "WITH RECURSIVE pg_settings AS (SELECT 1 AS x INTERSECT SELECT 1 FROM pg_settings) "
        "SELECT * FROM pg_settings",
        "WITH RECURSIVE pg_settings AS (SELECT name FROM (SELECT 'x' AS name UNION ALL "
        "SELECT name FROM pg_settings)) SELECT * FROM pg_settings",
        # A CTE of one branch of a UNION is not visible in the other.
        "(WITH sqlite_master AS (SELECT 1) SELECT * FROM sqlite_master) "
        "UNION ALL SELECT 1 FROM sqlite_master",
    ],
)
def test_cte_names_do_not_leak_out_of_their_scope(sql: str) -> None:
    assert "is not a dataset name" in refusal(sql)


def test_names_fold_as_duckdb_folds_them() -> None:
    # DuckDB folds ASCII case only: a Kelvin sign is not a 'k', so this CTE would not hide the
    # catalog view; non-ASCII names are refused outright.
    assert "ASCII" in refusal("WITH duc\u212adb_views AS (SELECT 1) SELECT * FROM duckdb_views")
    assert "not a dataset name" in refusal("SELECT * FROM duc\u212adb_views")
    assert dataset_names("SELECT * FROM BLOCKS") == {"blocks"}


def test_ctes_shadow_where_duckdb_says_they_do() -> None:
    sql = "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r, blocks"
    assert dataset_names(sql) == {"blocks"}
    # The recursive branch sees the CTE, in nested subqueries too; later CTEs and the body see it.
    sql = (
        "WITH RECURSIVE pg_settings AS (SELECT 'x' AS name UNION ALL SELECT name FROM "
        "(SELECT * FROM pg_settings) WHERE false), b AS (SELECT * FROM pg_settings) "
        "SELECT * FROM b JOIN (SELECT * FROM pg_settings) p USING (name)"
    )
    assert dataset_names(sql) == set()
    # A CTE named like a dataset hides it; one in an outer query is visible in subqueries.
    assert dataset_names("WITH blocks AS (SELECT 1 AS x) SELECT * FROM blocks") == set()
    sql = "WITH a AS (SELECT 1 AS x) SELECT (SELECT x FROM a), * FROM (WITH b AS (SELECT * FROM a) SELECT * FROM b)"
    assert dataset_names(sql) == set()
    assert dataset_names("WITH A AS (SELECT 1) SELECT * FROM a") == set()


# -- the hostile table ---------------------------------------------------------------------------
HOSTILE = [
    # settings, variables, secrets, session
    ("SELECT current_setting('allowed_paths')", "function 'current_setting' is not allowed"),
    ("SELECT list_transform([1], x -> current_setting('memory_limit'))", "'current_setting'"),
    ("SELECT getvariable('x')", "function 'getvariable' is not allowed"),
    ("SELECT * FROM duckdb_settings()", "table function 'duckdb_settings' is not allowed"),
    ("SELECT (SELECT count(*) FROM duckdb_settings())", "table function 'duckdb_settings'"),
    ("SELECT * FROM which_secret('s3://b/x', 's3')", "table function 'which_secret'"),
    ("SELECT * FROM pg_settings", "'pg_settings' is not a dataset name"),
    ("SELECT current_database()", "function 'current_database' is not allowed"),
    ("SELECT version()", "function 'version' is not allowed"),
    ("SELECT current_schema", "function 'current_schema' is not allowed"),
    ("SELECT alias.current_catalog", "function 'current_catalog' is not allowed"),
    ("SELECT USER FROM blocks", "function 'user' is not allowed"),
    ("SELECT nextval('s')", "function 'nextval' is not allowed"),
    ("SELECT setseed(0.5)", "function 'setseed' is not allowed"),
    # SQL text bound or run
    ("SELECT * FROM query('SELECT * FROM duckdb_settings()')", "table function 'query'"),
    ("SELECT * FROM query_table('duckdb_settings')", "table function 'query_table'"),
    ("SELECT json_serialize_sql('SELECT 1')", "function 'json_serialize_sql' is not allowed"),
    ("SELECT json_serialize_plan('SELECT * FROM pg_settings')", "'json_serialize_plan'"),
    (
        "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
        "table function 'json_execute_serialized_sql'",
    ),
    ("SELECT sql_auto_complete('SEL')", "function 'sql_auto_complete' is not allowed"),
    # catalog, view definitions
    ("SELECT * FROM duckdb_views()", "table function 'duckdb_views' is not allowed"),
    ("SELECT pg_get_viewdef(1)", "function 'pg_get_viewdef' is not allowed"),
    ("SELECT format_type(1, 1)", "function 'format_type' is not allowed"),
    ("SELECT * FROM sqlite_master", "'sqlite_master' is not a dataset name"),
    ("SELECT * FROM information_schema.tables", "'information_schema.tables' is not a dataset"),
    ("SELECT * FROM (SHOW ALL TABLES)", "SHOW/DESCRIBE"),
    ("SELECT * FROM (DESCRIBE blocks)", "SHOW/DESCRIBE"),
    ("SELECT * FROM (SUMMARIZE blocks)", "SHOW/DESCRIBE/SUMMARIZE"),
    ("SELECT pg_catalog.current_database()", "'pg_catalog.current_database' is not allowed"),
    ("SELECT system.main.lower('a')", "'system.main.lower' is not allowed"),
    # files
    ("SELECT * FROM glob('/etc/*')", "table functions are not allowed"),
    ("SELECT * FROM read_csv('/etc/passwd')", "table function 'read_csv' is not allowed"),
    ("SELECT * FROM blocks, read_json_auto('x.json')", "'read_json_auto'"),
    ("WITH x AS (SELECT * FROM read_text('/etc/passwd')) SELECT * FROM x", "'read_text'"),
    ("SELECT read_blob('/etc/passwd')", "function 'read_blob' is not allowed"),
    ("SELECT * FROM parquet_metadata('x.parquet')", "table function 'parquet_metadata'"),
    ("SELECT parse_path('/etc/passwd')", "function 'parse_path' is not allowed"),
    # network
    (
        "SELECT * FROM postgres_scan('host=10.9.9.9 port=5432', 'public', 't')",
        "table function 'postgres_scan' is not allowed",
    ),
    ("SELECT * FROM postgres_query('trace_pg', 'SELECT 1')", "'postgres_query'"),
    ("SELECT * FROM trace_pg.public.task_status", "qualified names"),
    ("SELECT * FROM main.blocks", "'main.blocks' is not a dataset name"),
    # through macros, lambdas, COLUMNS, CASE, windows, ORDER BY, aggregates by name
    ("SELECT list_aggr([1], 'current_setting')", "aggregate 'current_setting' is not allowed"),
    ("SELECT list_aggr([1], $agg)", "string literal"),
    ("SELECT COLUMNS(c -> getvariable(c)) FROM blocks", "'getvariable'"),
    ("SELECT CASE WHEN true THEN current_query() END", "'current_query'"),
    ("SELECT 1 FROM blocks ORDER BY current_setting('threads')", "'current_setting'"),
    ("SELECT sum(1) OVER (ORDER BY getvariable('a')) FROM blocks", "'getvariable'"),
    ("SELECT 1 FROM blocks QUALIFY txid_current() > 0", "'txid_current'"),
    ("SELECT * FROM (PIVOT blocks ON source IN e USING sum(gas_used))", "PIVOT … IN e"),
    ("SELECT * FROM (PIVOT blocks ON source IN ('a') USING version())", "'version'"),
    ("SELECT sum(gas_used) EXPORT_STATE FROM blocks", "EXPORT_STATE"),
    ("SELECT 1::my_type", "type 'my_type' is not allowed"),
    ("SELECT 'a' COLLATE evil", "collation 'evil' is not allowed"),
    ("SELECT * FROM blocks AT (VERSION => 1)", "AT (…) is not allowed"),
    ("SELECT write_log('x')", "function 'write_log' is not allowed"),
    ("SELECT sleep_ms(100000)", "function 'sleep_ms' is not allowed"),
    ("SELECT * FROM range(10)", "table function 'range' is not allowed"),
    ("SELECT * FROM unnest([1, 2])", "table function 'unnest' is not allowed"),
    ("SELECT x.lower() FROM blocks", "call functions by their plain name"),
    # statements other than one SELECT
    ("SET enable_external_access = true", "only SELECT"),
    ("RESET lock_configuration", "only SELECT"),
    ("PRAGMA database_list", "only SELECT"),
    ("ATTACH 'x.db' AS x", "only SELECT"),
    ("COPY blocks TO '/tmp/x.csv'", "only SELECT"),
    ("EXPORT DATABASE '/tmp/x'", "only SELECT"),
    ("INSTALL httpfs", "only SELECT"),
    ("LOAD httpfs", "only SELECT"),
    ("CALL duckdb_settings()", "only SELECT"),
    ("CREATE MACRO m() AS current_setting('threads')", "only SELECT"),
    ("CREATE TEMP VIEW v AS SELECT 1", "only SELECT"),
    ("SET VARIABLE x = 1", "only SELECT"),
    ("PREPARE p AS SELECT 1", "only SELECT"),
    ("EXECUTE p", "only SELECT"),
    ("INSERT INTO blocks VALUES (1)", "only SELECT"),
    ("DELETE FROM blocks", "only SELECT"),
    ("EXPLAIN SELECT 1", "only SELECT"),
    ("SELECT 1; SELECT 2", "one statement"),
    # (a PIVOT whose IN list is a query is run by DuckDB as two statements)
    ("SELECT * FROM (PIVOT blocks ON source IN (SELECT 'a') USING sum(gas_used))", "one statement"),
    ("", "empty"),
    ("SELECT 1 " + " " * 100_000, "100000"),
    ("SELEC 1", "bad SQL"),
]


@pytest.mark.parametrize(("sql", "needle"), HOSTILE)
def test_hostile_statements_are_refused_naming_what(sql: str, needle: str) -> None:
    assert needle in refusal(sql)


def test_the_hostile_table_is_big_enough() -> None:
    assert len(HOSTILE) >= 30


# -- things that stay allowed --------------------------------------------------------------------
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT t.user, t.current_date FROM blocks t",
        "SELECT current_date, current_timestamp, localtime, now(), today()",
        "SELECT lower(x) LIKE 'a%' ESCAPE '!', x GLOB 'a*', x SIMILAR TO 'a', x ILIKE 'b' FROM blocks",
        "SELECT EXTRACT(year FROM d), d AT TIME ZONE 'UTC', INTERVAL 3 DAY FROM blocks",
        "SELECT {'a': 1}, MAP {'a': 1}, [y FOR y IN [1, 2] IF y > 1], [1, 2][1:2], ROW(1, 2)",
        "SELECT list_transform([1], x -> x + 1), list_reduce([1, 2], (a, b) -> a + b)",
        "SELECT list_aggr([1, 2], 'sum'), list_sum([1]), array_to_string([1], ',')",
        "SELECT x::DECIMAL(18, 2), x::INT[], x::STRUCT(a INT), x::JSON, x::UUID FROM blocks",
        "SELECT 'a' COLLATE nocase, 'b' COLLATE nocase.noaccent",
        "SELECT COLUMNS(c -> c LIKE 'block%'), * EXCLUDE (gas_used) FROM blocks",
        "SELECT * FROM (PIVOT blocks ON source IN ('hot', 'cold') USING sum(gas_used))",
        "SELECT * FROM (UNPIVOT blocks ON gas_used, block_number INTO NAME n VALUE v)",
        "SELECT grouping(source), count(*) FROM blocks GROUP BY ROLLUP (source)",
        "SELECT x, rank() OVER w FROM blocks WINDOW w AS (ORDER BY x) QUALIFY rank() OVER w < 3",
        "SELECT arg_max(a, b), quantile_cont(a, 0.5), string_agg(a, ',' ORDER BY b) FROM blocks",
        "SELECT count(*) FILTER (WHERE a > 1), approx_count_distinct(a) FROM blocks",
        "SELECT lag(a) OVER (PARTITION BY b ORDER BY c ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM blocks",
        "SELECT * FROM blocks USING SAMPLE 10%",
        "SELECT 'SELECT * FROM read_csv(''/etc/passwd'')' AS text_not_sql",
        "FROM blocks SELECT block_number",
        "SELECT * FROM (VALUES (1), (2)) v(x)",
        "SELECT a FROM blocks INTERSECT SELECT a FROM transactions EXCEPT SELECT 1",
        "SELECT * FROM blocks b, LATERAL (SELECT b.block_number + 1)",
        "SELECT unnest([1, 2]), generate_series(1, 3), range(3)",
        "SELECT $1, $2",
        "SELECT ?",
        "SELECT $name",
        "SELECT strftime(now(), '%Y'), regexp_extract('a1', '[0-9]'), json_extract('{}', '$.a')",
        "SELECT main.lower('A')",
    ],
)
def test_ordinary_sql_passes(sql: str) -> None:
    dataset_names(sql)


# -- the allowlist itself ------------------------------------------------------------------------
def test_the_allowlist_names_only_builtin_computing_functions() -> None:
    con = duckdb.connect()
    kinds: dict[str, set[str]] = {}
    for name, kind, schema in con.execute(
        "SELECT function_name, function_type, schema_name FROM duckdb_functions()"
    ).fetchall():
        kinds.setdefault(name.lower(), set()).add(f"{kind}@{schema}")
    missing = sorted(n for n in ALLOWED_FUNCTIONS if n not in kinds)
    assert missing == [], "allowlisted, but not a function of this DuckDB"
    computing = {"scalar@main", "aggregate@main", "macro@main"}
    # unnest is listed as a table function, but in a select list it is the UNNEST expression.
    odd = sorted(n for n in ALLOWED_FUNCTIONS if not kinds[n] & computing and n != "unnest")
    assert odd == [], "allowlisted, but neither scalar, aggregate nor macro"
    pg_catalog = sorted(n for n in ALLOWED_FUNCTIONS if any("pg_catalog" in k for k in kinds[n]))
    assert pg_catalog == []
    # Every macro on the list expands to allowed functions only.
    for name, body in con.execute(
        "SELECT function_name, macro_definition FROM duckdb_functions() "
        "WHERE function_type = 'macro' AND schema_name = 'main'"
    ).fetchall():
        if name in ALLOWED_FUNCTIONS:
            dataset_names(f"SELECT {body}")


def test_no_function_that_reads_the_outside_is_allowlisted() -> None:
    never = {
        "current_setting", "getvariable", "current_database", "current_schema", "current_schemas",
        "current_query", "current_user", "version", "txid_current", "in_search_path", "nextval",
        "currval", "json_serialize_sql", "json_deserialize_sql", "json_serialize_plan",
        "json_execute_serialized_sql", "query", "query_table", "sql_auto_complete",
        "which_secret", "read_text", "read_blob", "read_csv", "read_parquet", "glob",
        "pg_get_viewdef", "format_type", "get_block_size", "setseed", "write_log", "sleep_ms",
        "make_type", "postgres_scan", "postgres_query", "duckdb_settings", "duckdb_views",
    }  # fmt: skip
    assert never & ALLOWED_FUNCTIONS == set()
    con = duckdb.connect()
    table_only = {
        n
        for (n,) in con.execute(
            "SELECT function_name FROM duckdb_functions() GROUP BY 1 "
            "HAVING bool_and(function_type IN ('table', 'table_macro', 'pragma'))"
        ).fetchall()
    }
    assert table_only & ALLOWED_FUNCTIONS == {"unnest"}


def test_deep_nesting_is_refused_not_a_crash() -> None:
    for depth in (900, 5000, 40_000):
        refusal("SELECT " + "lower(" * depth + "'a'" + ")" * depth)
    refusal("SELECT " + "(" * 40_000 + "1" + ")" * 40_000)
    dataset_names("SELECT " + "lower(" * 300 + "'a'" + ")" * 300)


def test_refusals_are_the_guards_error_type() -> None:
    assert issubclass(QueryRefused, guard.Invalid)
