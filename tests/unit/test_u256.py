"""Exact amounts without Spark: the helpers' expansion and refusals, DuckDB BIGNUM results as
exact text, and the devnet's large-amount script. (The limbs themselves are checked against
Python's integers on the real Spark: tests/integration/test_exact_amounts.py.)"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from trace_platform.devnet.big_token import LINE, MAX, SCRIPT, Step, replay, schedule
from trace_platform.query import bignum, formats
from trace_platform.spark import u256
from trace_platform.spark.dialect import DIALECT
from trace_platform.spark.sql_guard import SqlRefused, check_query

# --- the helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        ("SELECT u256_mul(value, 2) FROM t", "'u256_mul' is not a u256 helper"),
        ("SELECT u256_sum(value, 1) FROM t", "u256_sum takes 1 plain argument"),
        ("SELECT u256_add(value) FROM t", "u256_add takes 2 plain argument"),
        ("SELECT u256_sum(DISTINCT value) FROM t", "u256_sum takes 1 plain argument"),
        ("SELECT SUM(value) FROM t WHERE reflect('a', 'b') = u256(1)", "reflect"),
    ],
)
def test_misused_helpers_are_refused(sql: str, needle: str) -> None:
    with pytest.raises(SqlRefused, match=needle):
        check_query(sql, ["t"])


def _calls(sql: str) -> list[str]:
    tree = sqlglot.parse_one(sql, read=DIALECT)
    return [f.name.lower() for f in tree.find_all(exp.Anonymous)]


def test_helpers_expand_into_built_ins_with_their_clauses() -> None:
    sql = check_query(
        "SELECT g, u256_sum(v) FILTER (WHERE g > 1) AS f, u256_text(u256_add(u256(1), v)) AS t,"
        " u256_sum(u256_neg(v)) OVER (PARTITION BY g ORDER BY i ROWS 2 PRECEDING) AS w FROM t",
        ["t"],
    ).sql
    assert not [c for c in _calls(sql) if c.startswith("u256")]
    tree = sqlglot.parse_one(sql, read=DIALECT)
    windows = list(tree.find_all(exp.Window))
    # Each limb sum keeps the window (3 limbs, each referenced by the carry) and the FILTER.
    assert windows and all(w.args["partition_by"][0].name == "g" for w in windows)
    assert {w.args["spec"].sql(dialect=DIALECT) for w in windows} == {
        "ROWS BETWEEN 2 PRECEDING AND CURRENT ROW"
    }
    filtered = [f for f in tree.find_all(exp.Filter) if isinstance(f.this, exp.Sum)]
    assert sorted(f.this.this.expressions[0].name for f in filtered) == sorted(u256.FIELDS)
    assert len(windows) == len(u256.FIELDS)


# --- BIGNUM results -----------------------------------------------------------------------------

big = st.integers(min_value=-(2**300), max_value=2**300)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(big, st.sampled_from([0, -1, 1, MAX, -MAX, 2**255, 255, 256, -256]))))
def test_bignum_results_are_exact_text(values: list[int]) -> None:
    """DuckDB's own BIGNUM encoding (no hand-made bytes) back to Python's integers."""
    con = duckdb.connect()
    table = con.execute(
        "SELECT v::BIGNUM AS v, n FROM (SELECT unnest(?::VARCHAR[]) AS v, "
        "unnest(range(len(?::VARCHAR[]))) AS n) ORDER BY n",
        [[str(v) for v in values], [str(v) for v in values]],
    ).arrow()
    table = table.read_all() if isinstance(table, pa.RecordBatchReader) else table
    if values:
        assert bignum.is_bignum(table.schema.field("v").type)
    out = bignum.to_text(table)
    assert out.column("v").to_pylist() == [str(v) for v in values]
    assert formats.columns(out)[0]["type"] == "bignum"
    assert formats.rows(out) == [[str(v), i] for i, v in enumerate(values)]


def test_bignum_nulls_stay_null() -> None:
    con = duckdb.connect()
    table = con.execute("SELECT CAST(NULL AS BIGNUM) AS v UNION ALL SELECT 5::BIGNUM").arrow()
    table = table.read_all() if isinstance(table, pa.RecordBatchReader) else table
    assert sorted(bignum.to_text(table).column("v").to_pylist(), key=str) == ["5", None]


# --- the devnet's large-amount token ------------------------------------------------------------


def test_the_large_amount_script_is_valid_and_covers_the_edges() -> None:
    balances, supplies = replay()
    mints = [s.amount for s in SCRIPT if s.kind == "mint"]
    assert {2**200, 2**255, MAX} <= set(mints)
    assert max(supplies) == MAX and all(0 <= s <= MAX for s in supplies)
    moved = [s.amount for s in SCRIPT if s.kind != "mint"]
    assert any(a < LINE for a in moved) and any(a > LINE for a in moved) and LINE in moved
    assert sum(balances) == supplies[-1] and supplies[-1] > LINE


def test_the_script_refuses_what_the_contract_would_revert() -> None:
    with pytest.raises(ValueError, match="holder 0 has 0"):
        replay((Step("burn", 0, None, 1),))
    with pytest.raises(ValueError, match="supply"):
        replay((Step("mint", None, 0, MAX), Step("mint", None, 1, 1)))


def test_the_schedule_spreads_the_script_over_the_chain() -> None:
    steps = schedule(3, 299)
    assert list(steps.values()) == list(SCRIPT)
    assert min(steps) == 3 and max(steps) <= 299
    assert schedule(3, 10) == {}  # too short a chain: the token is there, the script is not


# --- the demo's charts --------------------------------------------------------------------------


def test_the_demo_charts_draw_uint256_sized_amounts(tmp_path: Path) -> None:
    """Amounts arrive as exact text up to 2^256-1 (and sums past it): the charts scale them to
    floats for drawing and never crash."""
    from trace_platform.lite.charts import holders_chart, supply_chart

    amounts = [0, 1, LINE - 1, LINE + 1, 2**200, 2**255, MAX, 2 * MAX]
    supply = [{"block_number": b, "total_supply": str(v)} for b, v in enumerate(amounts)]
    history = [
        {"block_number": b, "account": f"0x{who:040x}", "balance": str(v)}
        for who in (1, 2)
        for b, v in enumerate(amounts)
    ]
    for path in (
        supply_chart(supply, tmp_path / "supply.png", "0x" + "b1" * 20),
        holders_chart(history, tmp_path / "holders.png", "0x" + "b1" * 20, decimals=0),
    ):
        assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 10_000
