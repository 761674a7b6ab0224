"""What sql_transform's guard lets Spark run: one read query over the job's own input views."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlglot
import yaml
from sqlglot import exp

from trace_platform.operators.context import PermanentError
from trace_platform.spark import helpers
from trace_platform.spark.dialect import DIALECT
from trace_platform.spark.sql_allowlist import SPARK_EXTRA_FUNCTIONS
from trace_platform.spark.sql_guard import SqlRefused, check_query

INPUTS = ["transfers", "blocks"]
DEMO = Path(__file__).resolve().parents[2] / "examples" / "dags" / "monad_demo.yaml"

HOSTILE: list[tuple[str, str]] = [
    # files
    ("SELECT value FROM text.`/srv/trace/.trace/admin.key`", "file-path table text.`/srv"),
    ("SELECT * FROM parquet.`/srv/data/org/x`", "file-path table parquet."),
    ("SELECT * FROM csv.`/etc/passwd`", "file-path table csv."),
    ("SELECT * FROM json.`/proc/self/environ`", "file-path table json."),
    ("SELECT * FROM `orc`.`/x`", "file-path table `orc`"),
    ("SELECT * FROM transfers UNION ALL SELECT * FROM text.`/x`", "file-path table text."),
    ("SELECT * FROM (text.`/etc/shadow`)", "file-path table text."),
    ("SELECT * FROM `/etc/passwd`", "table '/etc/passwd' is not an input of this job"),
    ("SELECT input_file_name() FROM transfers", "function 'input_file_name' is not allowed"),
    # programs and Java
    (
        "SELECT TRANSFORM(value) USING 'sh -c id' FROM transfers",
        "TRANSFORM … USING (runs a program)",
    ),
    ("FROM transfers SELECT TRANSFORM(*) USING 'cat' AS (a)", "TRANSFORM … USING (runs a program)"),
    ("SELECT MAP value USING 'cat' FROM transfers", "cannot parse"),
    (
        "SELECT java_method('java.lang.System', 'getenv', 'X')",
        "function 'java_method' is not allowed",
    ),
    (
        "SELECT JAVA_METHOD('java.lang.Runtime', 'getRuntime')",
        "function 'java_method' is not allowed",
    ),
    ("SELECT reflect('java.lang.System', 'getenv', 'X')", "function 'reflect' is not allowed"),
    ("SELECT try_reflect('java.lang.System', 'getenv')", "function 'try_reflect' is not allowed"),
    ("SELECT java_anything(1)", "function 'java_anything' is not allowed"),
    ("SELECT `reflect`('java.lang.System', 'getenv', 'X')", "function 'reflect' is not allowed"),
    ("SELECT system.builtin.reflect('a', 'b')", "qualified function name"),
    ("SELECT db.my_udf(value) FROM transfers", "qualified function name"),
    ("SELECT my_udf(value) FROM transfers", "function 'my_udf' is not allowed"),
    (
        "SELECT * FROM transfers WHERE value IN (SELECT reflect('a', 'b'))",
        "function 'reflect' is not allowed",
    ),
    (
        "SELECT * FROM transfers LATERAL VIEW reflect('a', 'b') v AS x",
        "LATERAL VIEW with 'reflect'",
    ),
    ("SELECT xpath('<a/>', '/a')", "function 'xpath' is not allowed"),
    ("SELECT current_user()", "function 'current_user' is not allowed"),
    ("SELECT version()", "function 'version' is not allowed"),
    # environment and config
    ("SELECT '${env:TRACE_STATE_DSN}'", "${…} variable substitution"),
    ("SELECT ${system:java.version}", "${…} variable substitution"),
    ("SELECT @@x", "${…} variable substitution"),
    ("SET spark.sql.runSQLOnFiles=true", "refuses SET"),
    ("SET", "refuses SET"),
    ("RESET", "refuses RESET"),
    # not a query
    ("ADD JAR /tmp/evil.jar", "refuses ADD JAR"),
    ("ADD FILE /etc/passwd", "refuses ADD FILE"),
    ("ADD ARCHIVE /tmp/x.zip", "refuses ADD ARCHIVE"),
    ("CREATE TEMPORARY FUNCTION f AS 'com.evil.F'", "CREATE FUNCTION (it registers code)"),
    ("CREATE FUNCTION f AS 'a.B' USING JAR '/tmp/x.jar'", "CREATE FUNCTION (it registers code)"),
    ("CREATE TEMPORARY VIEW v AS SELECT 1", "refuses CREATE VIEW"),
    ("CREATE TABLE t AS SELECT * FROM transfers", "refuses CREATE TABLE"),
    ("INSERT INTO transfers SELECT * FROM transfers", "refuses INSERT"),
    ("INSERT OVERWRITE DIRECTORY '/tmp/out' SELECT * FROM transfers", "refuses INSERT"),
    ("DROP TABLE transfers", "refuses DROP TABLE"),
    ("ALTER TABLE transfers ADD COLUMNS (x INT)", "refuses ALTER TABLE"),
    (
        "MERGE INTO transfers t USING blocks b ON t.a = b.a WHEN MATCHED THEN DELETE",
        "refuses MERGE",
    ),
    ("DELETE FROM transfers", "refuses DELETE"),
    ("UPDATE transfers SET value = 0", "refuses UPDATE"),
    ("LOAD DATA INPATH '/x' INTO TABLE transfers", "refuses LOAD DATA"),
    ("CACHE TABLE transfers", "refuses CACHE"),
    ("UNCACHE TABLE transfers", "refuses UNCACHE"),
    ("REFRESH TABLE transfers", "refuses REFRESH"),
    ("USE other_db", "refuses USE"),
    ("SHOW TABLES", "refuses SHOW"),
    ("DESCRIBE transfers", "refuses DESCRIBE"),
    ("EXPLAIN SELECT 1", "refuses EXPLAIN"),
    ("EXECUTE IMMEDIATE 'ADD JAR /tmp/x.jar'", "refuses EXECUTE"),
    ("DECLARE VARIABLE v INT", "refuses DECLARE"),
    ("SELECT 1; ADD JAR /tmp/x.jar", "2 statements"),
    ("SELECT 1; SELECT 2", "2 statements"),
    # tables that are not this job's inputs
    ("SELECT * FROM global_temp.left_behind", "qualified table name global_temp.left_behind"),
    ("SELECT * FROM spark_catalog.default.t", "qualified table name spark_catalog.default.t"),
    (
        "SELECT * FROM left_behind",
        "table 'left_behind' is not an input of this job (inputs: blocks, transfers)",
    ),
    ("SELECT * FROM transfers VERSION AS OF 1", "table clause VERSION"),
    ("SELECT * FROM IDENTIFIER('left_behind')", "table function 'identifier'"),
    ("SELECT * FROM read_files('/etc')", "table function 'read_files'"),
    # CTE scoping: a CTE never hides a table read outside its scope
    ("WITH x AS (SELECT * FROM secrets) SELECT * FROM x", "table 'secrets' is not an input"),
    ("WITH x AS (SELECT * FROM x) SELECT * FROM x", "table 'x' is not an input"),
    ("WITH b AS (SELECT * FROM a), a AS (SELECT 1) SELECT * FROM b", "table 'a' is not an input"),
    (
        "SELECT * FROM transfers WHERE EXISTS (WITH s AS (SELECT 1) SELECT 1) AND 1 IN (SELECT * FROM s)",
        "table 's' is not an input",
    ),
    # a subquery alias is not a table name
    ("SELECT * FROM (SELECT 1) AS secrets, secrets", "table 'secrets' is not an input"),
    # hints: plain ones only
    ("SELECT /*+ EVIL(transfers) */ * FROM transfers", "the hint 'EVIL'"),
    ("SELECT /*+ BROADCAST(reflect('a')) */ * FROM transfers", "the hint argument"),
]


@pytest.mark.parametrize(("sql", "needle"), HOSTILE, ids=[s[:50] for s, _ in HOSTILE])
def test_hostile_statements_are_refused_naming_what(sql: str, needle: str) -> None:
    with pytest.raises(SqlRefused) as err:
        check_query(sql, INPUTS)
    assert isinstance(err.value, PermanentError)  # the task fails at once, no retry
    assert needle in str(err.value), str(err.value)
    assert str(err.value).startswith("sql_transform ")


def test_there_are_enough_hostile_cases() -> None:
    assert len(HOSTILE) >= 25


ORDINARY = [
    "SELECT t.value, b.ts FROM transfers t JOIN blocks b ON t.block_number = b.number "
    "LEFT JOIN blocks b2 USING (number) WHERE t.value > 0",
    "SELECT token, ROW_NUMBER() OVER (PARTITION BY token ORDER BY value DESC NULLS LAST) AS rn, "
    "LAG(value, 1) OVER w, SUM(value) OVER (PARTITION BY token ORDER BY block_number "
    "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) FROM transfers WINDOW w AS (ORDER BY block_number)",
    "WITH a AS (SELECT * FROM transfers), b AS (SELECT token FROM a) SELECT * FROM b JOIN a USING (token)",
    "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
    "SELECT token, COUNT(*), COUNT(DISTINCT account), SUM(value), AVG(value), MIN(value), MAX(value), "
    "approx_count_distinct(account), percentile_approx(value, 0.5), collect_list(value), "
    "max_by(account, value) FROM transfers GROUP BY token HAVING COUNT(*) > 1",
    "SELECT CASE WHEN value BETWEEN 1 AND 2 THEN 'small' WHEN value IN (3, 4) THEN 'mid' ELSE NULL END "
    "FROM transfers",
    "SELECT CAST(value AS DECIMAL(38,0)), TRY_CAST(value AS BIGINT), CAST(value AS DOUBLE) FROM transfers",
    "SELECT explode(sequence(1, 5)) AS w",
    "SELECT * FROM transfers LATERAL VIEW explode(array(1, 2)) x AS y LATERAL VIEW OUTER "
    "posexplode(array(3)) z AS p, q",
    "SELECT * FROM range(10)",
    "SELECT * FROM transfers UNION ALL SELECT * FROM blocks EXCEPT SELECT * FROM transfers",
    "VALUES (1, 'a'), (2, 'b')",
    "SELECT * FROM VALUES (1, 2) AS v(a, b)",
    "SELECT value FROM transfers WHERE EXISTS (SELECT 1 FROM blocks WHERE blocks.n = transfers.n) "
    "AND value NOT IN (SELECT value FROM blocks) ORDER BY value LIMIT 10",
    "SELECT transform(arr, x -> x + 1), filter(arr, x -> x > 0), aggregate(arr, 0, (a, x) -> a + x), "
    "arr[0], m['k'], s.field, named_struct('a', 1), map(1, 2) FROM transfers",
    "SELECT lower(hex(value)), concat_ws(',', a, b), substring(s, 1, 3), date_trunc('day', ts), "
    "coalesce(a, b), nullif(a, 0), round(x, 2), x DIV 3, x % 2, sha2(s, 256), xxhash64(s), "
    "conv(s, 16, 10), pmod(x, 3), isnotnull(x) FROM transfers",
    "SELECT /*+ BROADCAST(b), REPARTITION(4) */ * FROM transfers t JOIN blocks b ON t.n = b.n",
    "SELECT * FROM transfers TABLESAMPLE (10 PERCENT)",
    "SELECT * FROM transfers PIVOT (sum(value) FOR token IN ('a', 'b'))",
    "SELECT * FROM transfers WHERE block_number > :from_block AND token = ?",
    "SELECT * FROM TRANSFERS",  # names are case-insensitive, as in Spark
    "SELECT 1",
]


@pytest.mark.parametrize("sql", ORDINARY, ids=[s[:50] for s in ORDINARY])
def test_ordinary_queries_pass_and_regenerate_stably(sql: str) -> None:
    checked = check_query(sql, INPUTS)
    # What runs is a fixed point: checking it again gives the same text.
    assert check_query(checked.sql, INPUTS).sql == checked.sql
    assert "/*" not in checked.sql or "/*+" in checked.sql  # comments dropped, hints kept


def test_the_guard_reports_what_the_query_reads() -> None:
    checked = check_query(
        "WITH recent AS (SELECT * FROM Transfers WHERE block_number > :lo) "
        "SELECT * FROM recent r JOIN blocks b ON r.block_number = b.number",
        INPUTS,
    )
    assert checked.tables == {"transfers", "blocks"}
    assert checked.ctes == {"recent"}
    assert checked.parameters == {"lo"}
    assert ":lo" in checked.sql


def test_comments_are_not_run() -> None:
    checked = check_query("SELECT 1 -- */ , java_method('a', 'b')\nFROM transfers", INPUTS)
    assert "java_method" not in checked.sql.lower()
    assert checked.sql == "SELECT 1 FROM transfers"


def test_strings_keep_their_spark_meaning() -> None:
    # Spark reads a doubled quote inside a literal as one quote, not as two adjacent literals.
    assert check_query("SELECT 'it''s' AS v", INPUTS).sql == "SELECT 'it\\'s' AS v"
    assert check_query('SELECT "d""q" AS v', INPUTS).sql == "SELECT 'd\"q' AS v"
    assert check_query("SELECT 'a' 'b' AS v", INPUTS).sql == "SELECT CONCAT('a', 'b') AS v"


def test_a_parse_failure_is_a_permanent_refusal() -> None:
    with pytest.raises(SqlRefused, match="cannot parse"):
        check_query("SELECT FROM WHERE (", INPUTS)
    with pytest.raises(SqlRefused, match="needs one query"):
        check_query(";", INPUTS)


def test_the_extra_allowlist_holds_no_denied_function() -> None:
    for name in ("reflect", "java_method", "try_reflect", "input_file_name", "xpath", "version"):
        assert name not in SPARK_EXTRA_FUNCTIONS
    assert not [n for n in SPARK_EXTRA_FUNCTIONS if n.startswith("java_")]


def _demo_jobs() -> list[tuple[str, str, list[str], dict[str, Any]]]:
    dag = yaml.safe_load(DEMO.read_text())
    published = {(p["job"], p["output_index"]): p["dataset"] for p in dag["publish"]}
    jobs = []
    for name, job in dag["jobs"].items():
        if job["operator"] != "sql_transform":
            continue
        views = [
            published.get((ref["job"], ref["output"])) or f"input_{i}"
            for i, ref in enumerate(job.get("inputs", []))
        ]
        jobs.append((name, job["config"]["sql"], views, job["config"].get("args") or {}))
    return jobs


DEMO_JOBS = _demo_jobs()


def test_the_demo_has_its_analytics() -> None:
    assert {name for name, *_ in DEMO_JOBS} == {
        "token_supply",
        "token_balances",
        "staking_periods",
        "validator_stake",
        "staking_concentration",
        "delegator_stake",
        "delegator_concentration",
    }


@pytest.mark.parametrize(("job", "sql", "views", "args"), DEMO_JOBS, ids=[j[0] for j in DEMO_JOBS])
def test_the_demo_analytics_pass_and_keep_their_meaning(
    job: str, sql: str, views: list[str], args: dict[str, Any]
) -> None:
    checked = check_query(sql, views)
    assert checked.tables <= set(views)
    # `:window_blocks` and the synced blocks sql_transform binds survive regeneration.
    synced = {f"{v}_{edge}_block" for v in views for edge in ("first", "last")}
    assert set(args) <= checked.parameters <= set(args) | synced
    for name in checked.parameters:
        assert f":{name}" in checked.sql
    # Regeneration changes the text, not the tree (up to sqlglot's normalisation), once the
    # u256 helpers are expanded into the built-ins they stand for.
    original = helpers.expand(sqlglot.parse_one(sql, read=DIALECT))
    regenerated = sqlglot.parse_one(checked.sql, read=DIALECT)
    assert original == regenerated
    assert not [f for f in regenerated.find_all(exp.Anonymous) if f.name.startswith("u256")]


def test_an_accepted_query_is_checked_once_and_a_refusal_every_time() -> None:
    """The guard remembers what it accepted (an operator host runs a job's SQL task after task),
    per text and views; a refused query is refused again, and other views are checked anew."""
    sql = "SELECT u256_sum(value) AS total FROM transfers"
    first = check_query(sql, ["transfers"])
    assert check_query(sql, iter(["transfers"])) is first
    with pytest.raises(SqlRefused, match="not an input"):
        check_query(sql, ["other"])
    for _ in range(2):
        with pytest.raises(SqlRefused, match="DROP"):
            check_query("DROP TABLE transfers", ["transfers"])
