"""What the Query Service's guard lets through: dataset names only, read by one SELECT."""

from __future__ import annotations

import pytest

from trace_platform.query import saved
from trace_platform.query.guard import QueryRefused, dataset_names


def test_names_come_from_every_clause_but_not_from_ctes() -> None:
    sql = """
      WITH recent AS (SELECT * FROM Blocks WHERE block_number > $from)
      SELECT r.block_number, (SELECT count(*) FROM logs l WHERE l.block_number = r.block_number)
      FROM recent r ASOF LEFT JOIN token_supply s ON r.block_number >= s.block_number
      WHERE r.block_number IN (SELECT block_number FROM transactions)
    """
    assert dataset_names(sql) == {"blocks", "logs", "token_supply", "transactions"}


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
    ],
)
def test_cte_names_do_not_leak_out_of_their_scope(sql: str) -> None:
    names = dataset_names(sql)
    assert names & {"duckdb_databases", "duckdb_settings"}  # so: an unknown dataset, refused


def test_recursive_ctes_see_themselves() -> None:
    sql = "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r, blocks"
    assert dataset_names(sql) == {"blocks"}


@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        ("SELECT * FROM glob('/etc/*')", "table functions"),
        ("SELECT * FROM blocks, read_json_auto('x.json')", "read_json_auto"),
        ("SELECT * FROM (SELECT * FROM duckdb_settings())", "duckdb_settings"),
        ("WITH x AS (SELECT * FROM read_text('/etc/passwd')) SELECT * FROM x", "read_text"),
        ("SELECT * FROM pg.public.tasks", "qualified names"),
        ("SELECT * FROM blocks, (SHOW ALL TABLES)", "SHOW/DESCRIBE"),
        ("SELECT * FROM (DESCRIBE blocks)", "SHOW/DESCRIBE"),
        ("INSERT INTO blocks VALUES (1)", "only SELECT"),
        ("PRAGMA database_list", "only SELECT"),
        ("SET enable_external_access = true", "only SELECT"),
        ("", "empty"),
    ],
)
def test_refused(sql: str, needle: str) -> None:
    with pytest.raises(QueryRefused) as e:
        dataset_names(sql)
    assert needle in e.value.message


def test_every_saved_query_parses_and_declares_its_parameters() -> None:
    assert set(saved.names()) >= {"token_supply", "top_holders", "holder_history"}
    for name in saved.names():
        q = saved.load(name)
        assert q.description, name
        assert dataset_names(q.sql), name
        filled = {k: "0xab" if v == "" else v for k, v in q.defaults.items()}
        assert set(q.params(filled)) <= set(q.defaults)
