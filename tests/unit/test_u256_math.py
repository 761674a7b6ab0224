"""The exact-amount SQL (spark/u256.py's templates, as the SQL guard expands the u256 helpers)
against Python's integers, in milliseconds: a small evaluator runs the very expression trees
Spark would, with Spark's ANSI semantics (BIGINT overflow is an error, `DIV` truncates,
`%` takes the dividend's sign, a struct compares field by field), so the carry of a limb sum
back into floor form and the struct order that is the number's order are checked on every
example without a JVM. (tests/integration/test_exact_amounts.py checks the same on the real
Spark, slowly.)"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable
from typing import Any

import pytest
import sqlglot
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from trace_platform.devnet.big_token import LINE, MAX
from trace_platform.spark import u256
from trace_platform.spark.dialect import DIALECT
from trace_platform.spark.sql_guard import check_query

BIG = 2**63  # BIGINT: -BIG .. BIG - 1


class SqlError(Exception):
    """What Spark would raise: ANSI overflow, a bad cast, raise_error()."""


def _long(v: int) -> int:
    if not -BIG <= v < BIG:
        raise SqlError(f"ARITHMETIC_OVERFLOW: {v} is past a BIGINT")
    return v


def _div(a: int, b: int) -> int:  # Java's long division: toward zero
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _mod(a: int, b: int) -> int:  # Java's %: the dividend's sign
    return a - b * _div(a, b)


def _arith(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def f(a: Any, b: Any) -> Any:
        out = op(a, b)
        return _long(out) if isinstance(out, int) else out

    return f


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    exp.Add: _arith(operator.add),
    exp.Sub: _arith(operator.sub),
    exp.Mul: _arith(operator.mul),
    exp.IntDiv: lambda a, b: _long(_div(a, b)),
    exp.Mod: lambda a, b: _mod(a, b),
    exp.EQ: operator.eq,
    exp.GT: operator.gt,
    exp.LT: operator.lt,
}


def _order(v: Any) -> Any:
    """Spark's order of a value: a struct field by field, in its fields' order."""
    return tuple(v.values()) if isinstance(v, dict) else v


def _like(text: str, pattern: str) -> bool:
    rx = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, text, flags=re.DOTALL) is not None


class Evaluator:
    """Evaluates a Spark SQL expression tree for one row (`env`: column and lambda variable
    values), aggregates over `group` (the rows of the row's group)."""

    def __init__(self, group: list[dict[str, Any]] | None = None) -> None:
        self.group = group or []

    def __call__(self, node: exp.Expression, env: dict[str, Any]) -> Any:
        ev = self
        if isinstance(node, (exp.Paren, exp.Alias)):
            return ev(node.this, env)
        if isinstance(node, exp.Null):
            return None
        if isinstance(node, exp.Literal):
            if node.is_string:
                return node.this
            text = node.this
            return float(text) if any(c in text for c in ".eE") else int(text)
        if isinstance(node, (exp.Column, exp.Identifier)):
            return env[node.name]
        if isinstance(node, exp.Neg):
            v = ev(node.this, env)
            return None if v is None else _long(-v) if isinstance(v, int) else -v
        if type(node) in _BINARY:
            a, b = ev(node.this, env), ev(node.expression, env)
            return None if a is None or b is None else _BINARY[type(node)](a, b)
        if isinstance(node, exp.Is):
            assert isinstance(node.expression, exp.Null)
            return ev(node.this, env) is None
        if isinstance(node, exp.Not):
            v = ev(node.this, env)
            return None if v is None else not v
        if isinstance(node, exp.Case):
            for branch in node.args["ifs"]:
                if ev(branch.this, env) is True:
                    return ev(branch.args["true"], env)
            default = node.args.get("default")
            return None if default is None else ev(default, env)
        if isinstance(node, (exp.Cast, exp.TryCast)):  # ANSI: a bad cast is an error, too
            return self.cast(ev(node.this, env), node.to)
        if isinstance(node, exp.Struct):
            out = {}
            for f in node.expressions:
                assert isinstance(f, (exp.PropertyEQ, exp.Alias))
                name = f.this.name if isinstance(f, exp.PropertyEQ) else f.alias
                value = f.expression if isinstance(f, exp.PropertyEQ) else f.this
                out[name] = ev(value, env)
            return out
        if isinstance(node, exp.Bracket):
            base, (key,) = ev(node.this, env), node.expressions
            k = ev(key, env)
            if base is None:
                return None
            return base[k - node.args.get("offset", 0)] if isinstance(base, list) else base[k]
        if isinstance(node, exp.Array):
            return [ev(e, env) for e in node.expressions]
        if isinstance(node, exp.Transform):
            lam = node.expression
            assert isinstance(lam, exp.Lambda)
            (var,) = lam.expressions
            return [ev(lam.this, {**env, var.name: e}) for e in ev(node.this, env)]
        if isinstance(node, exp.Concat):
            parts = [ev(e, env) for e in node.expressions]
            return None if any(p is None for p in parts) else "".join(parts)
        if isinstance(node, exp.Pad):
            text, width = ev(node.this, env), ev(node.expression, env)
            fill = ev(node.args["fill_pattern"], env)
            assert node.args["is_left"] and len(fill) == 1
            return None if text is None else text.rjust(width, fill)[-width:][:width]
        if isinstance(node, exp.Substring):
            text, begin = ev(node.this, env), ev(node.args["start"], env)
            length = node.args.get("length")
            end = None if length is None else begin - 1 + ev(length, env)
            return None if text is None else text[begin - 1 : end]
        if isinstance(node, exp.Like):
            text = ev(node.this, env)
            return None if text is None else _like(text, ev(node.expression, env))
        if isinstance(node, exp.RegexpLike):
            text = ev(node.this, env)
            pattern = ev(node.expression, env).replace("\\z", "\\Z")  # Java's \z
            return None if text is None else re.search(pattern, text) is not None
        if isinstance(node, exp.Anonymous) and node.name.lower() == "raise_error":
            raise SqlError(ev(node.expressions[0], env))
        if isinstance(node, (exp.Sum, exp.Max, exp.Min)):
            values = [v for row in self.group if (v := ev(node.this, row)) is not None]
            if not values:
                return None
            if isinstance(node, exp.Sum):
                total = 0
                for v in values:  # ANSI: a running sum past a BIGINT is an error
                    total = _long(total + v)
                return total
            pick = max if isinstance(node, exp.Max) else min
            return pick(values, key=_order)
        raise NotImplementedError(f"{type(node).__name__}: {node.sql(dialect=DIALECT)[:80]}")

    @staticmethod
    def cast(v: Any, to: exp.DataType) -> Any:
        if v is None:
            return None
        if to.is_type(exp.DataType.Type.BIGINT):
            if isinstance(v, str):
                if not re.fullmatch(r"[+-]?[0-9]+", v.strip()):
                    raise SqlError(f"CAST_INVALID_INPUT: {v!r}")
                v = int(v)
            if not -BIG <= v < BIG:
                raise SqlError(f"CAST_OVERFLOW: {v}")
            return v
        if to.is_type(exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR):
            return str(v)
        if to.is_type(exp.DataType.Type.DOUBLE):
            return float(v)
        raise NotImplementedError(f"CAST AS {to.sql(dialect=DIALECT)}")


def limbs(n: int) -> dict[str, int]:
    """n in floor form, from Python's integers (the definition, not the code under test)."""
    out, v = {}, n
    for k in range(u256.TOP):
        v, out[f"l{k}"] = divmod(v, u256.BASE)
    out[f"l{u256.TOP}"] = v
    return {f: out[f] for f in u256.FIELDS}


def value(x: dict[str, int]) -> int:
    return sum(x[f"l{k}"] * u256.BASE**k for k in range(u256.TOP + 1))


def floor_form(x: dict[str, int]) -> bool:
    return list(x) == u256.FIELDS and all(0 <= x[f"l{k}"] < u256.BASE for k in range(u256.TOP))


@functools.cache
def expanded(sql: str) -> exp.Select:
    """The query as the guard passes it to Spark (once: the guard takes a second or two)."""
    tree = sqlglot.parse_one(check_query(sql, ["t"]).sql, read=DIALECT)
    assert isinstance(tree, exp.Select) and not tree.args.get("group")
    return tree


def select(sql: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A one-group aggregate SELECT over table t (or a one-row one) as the guard expands it,
    evaluated."""
    tree = expanded(sql)
    ev = Evaluator(rows)
    return {e.alias_or_name: ev(e, rows[0] if rows else {}) for e in tree.expressions}


# --- the limbs: floor form, and its order is the number's ---------------------------------

signed = st.integers(min_value=-MAX, max_value=MAX)
edges = st.sampled_from(
    [0, 1, MAX, 2**255, 2**200, LINE - 1, LINE, LINE + 1, 10**9, 10**9 - 1, 10**72, 10**18]
)
amounts = st.one_of(signed, edges, edges.map(lambda x: -x))


@settings(max_examples=200, deadline=None)
@given(amounts, amounts)
def test_floor_form_orders_like_the_number(a: int, b: int) -> None:
    """The struct of a number's limbs (u256.constant: what a literal becomes) is in floor form,
    and two structs compare, field by field from l8, as their numbers do: `=`, `<`, ORDER BY,
    max and min work on the struct as it is.

    Fails if u256.constant divides truncating instead of flooring, or if u256.FIELDS runs low
    to high (`range(TOP + 1)`)."""
    ev = Evaluator()
    x, y = ev(u256.constant(a), {}), ev(u256.constant(b), {})
    assert x == limbs(a) and y == limbs(b)
    assert floor_form(x) and value(x) == a
    assert (_order(x) < _order(y), x == y) == (a < b, a == b)


@settings(max_examples=200, deadline=None)
@given(amounts)
@example(-1)
@example(-(10**9))
@example(-(10**72))
def test_negation_stays_in_floor_form(a: int) -> None:
    """NEG and ABS: the exact negation, in floor form (so a negated amount still orders).

    Fails if u256._neg negates each limb (`-l_k`: the right number, not in floor form)."""
    ev = Evaluator()
    x = limbs(a)
    neg = ev(u256._tree(u256.NEG), {"__x": x})
    assert floor_form(neg) and value(neg) == -a
    magnitude = ev(u256._tree(u256.ABS), {"__x": x})
    assert floor_form(magnitude) and value(magnitude) == abs(a)


@settings(max_examples=200, deadline=None)
@given(st.lists(amounts, min_size=1, max_size=40))
@example([10**9 - 1, 1])  # one carry from l0 ripples through every limb
@example([u256.BASE**8 - 1, 1])
@example([-1, -1])
@example([MAX] * 40)
def test_limb_sums_carry_back_into_floor_form(values: list[int]) -> None:
    """NORM, the carry: limb sums (each limb summed on its own, as SUM does, so l0..l7 may hold
    up to n·(10^9 - 1)) carried back into the floor form of the exact sum.

    Fails if u256._norm drops the carry between limbs (`t.append(s)`) or into l8
    (`__s['s8']` alone)."""
    sums = {f"s{k}": sum(limbs(v)[f"l{k}"] for v in values) for k in range(u256.TOP + 1)}
    total = Evaluator()(u256._tree(u256.NORM), {"__s": sums})
    assert floor_form(total) and total == limbs(sum(values))


def test_norm_of_nothing_is_null() -> None:
    """SUM of no rows is NULL: so is its carried form (not zero)."""
    sums = {f"s{k}": None for k in range(u256.TOP + 1)}
    assert Evaluator()(u256._tree(u256.NORM), {"__s": sums}) is None


# --- the helpers as the guard expands them ---------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(st.lists(amounts, min_size=1, max_size=20))
@example([10**9 - 1, 1])
@example([-(10**9), 10**9 - 1])
def test_the_expanded_helpers_equal_python_integers(values: list[int]) -> None:
    """The query test_exact_amounts runs on Spark, expanded by the guard and evaluated here: the
    text parse, sums, negation, addition, max/min by struct order, text and the double.

    Fails on each mutation above (the carry, `-l_k` negation, FIELDS low to high)."""
    rows = [{"t": str(v), "v": limbs(v)} for v in values]
    got = select(
        """SELECT u256_sum(v) AS total, u256_sum(u256_neg(v)) AS negated,
                  u256_add(max(v), min(v)) AS extremes, u256_text(u256_sum(v)) AS text,
                  u256_double(u256_sum(v)) AS approx, max(v) AS top, min(v) AS bottom
           FROM t""",
        rows,
    )
    total = sum(values)
    assert (value(got["total"]), value(got["negated"]), got["text"]) == (
        total,
        -total,
        str(total),
    )
    assert (value(got["top"]), value(got["bottom"])) == (max(values), min(values))
    assert value(got["extremes"]) == max(values) + min(values)
    assert got["approx"] == pytest.approx(float(total), rel=1e-12, abs=1e-3)
    for x in (got["total"], got["negated"], got["extremes"]):
        assert floor_form(x)
    for row in rows:
        parsed = select("SELECT u256(t) AS p, u256_text(u256(t)) AS back FROM t", [row])
        assert parsed["p"] == row["v"] and parsed["back"] == row["t"]


@pytest.mark.parametrize("text", ["", "1.5", "+1", " 1", "1\n", "0x10", "1" * 91, "--1", "\u0661"])
def test_text_that_is_not_an_amount_raises(text: str) -> None:
    with pytest.raises(SqlError, match="invalid amount in u256"):
        select("SELECT u256(t) AS p FROM t", [{"t": text}])


def test_a_limb_sum_past_a_bigint_is_an_error() -> None:
    """ANSI: limbs summing past a BIGINT raise, never wrap (the evaluator is Spark's here)."""
    top = {"t": "1", "v": {**limbs(0), "l8": BIG - 1}}
    with pytest.raises(SqlError, match="ARITHMETIC_OVERFLOW"):
        select("SELECT u256_sum(v) AS s FROM t", [top, top])
