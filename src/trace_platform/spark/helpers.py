"""The helper functions sql_transform offers on top of Spark's built-ins: the exact-amount
helpers of `trace_platform.spark.u256`, written like functions, expanded here into native Spark
SQL before the guard checks the query (so the guard and Spark's parser only ever see built-ins,
and nothing but the JVM runs per row).

    u256(text_or_int)     amount text (or an integer) -> limbs; anything else is an error
    u256_neg(x)           -x
    u256_add(a, b)        a + b
    u256_sum(x)           SUM, as an aggregate (FILTER too) or a window (OVER …)
    u256_double(x)        an approximate DOUBLE, for ratios and charts only
    u256_text(x)          the exact decimal text (a plain STRING: not stored as an amount)
"""

from __future__ import annotations

from sqlglot import exp

from trace_platform.spark import u256


class HelperMisused(ValueError):
    """A u256_… call that is not one of the helpers, or has the wrong arguments (the guard
    refuses the query with this message)."""


ARITY: dict[str, int] = {
    "u256": 1,
    "u256_neg": 1,
    "u256_add": 2,
    "u256_sum": 1,
    "u256_double": 1,
    "u256_text": 1,
}


def _field(x: exp.Expression, limb: str) -> exp.Expression:
    inner = x.copy() if isinstance(x, (exp.Column, exp.Paren)) else exp.Paren(this=x.copy())
    return exp.Bracket(this=inner, expressions=[exp.Literal.string(limb)])


def _rewrap(call: exp.Expression, top: exp.Expression, inner: exp.Expression) -> exp.Expression:
    """`inner` inside copies of the FILTER / OVER clauses between `call` and `top`."""
    out, node = inner, call
    while node is not top:
        assert node.parent is not None
        node = node.parent
        wrapper = node.copy()
        wrapper.set("this", out)
        out = wrapper
    return out


def _sum(call: exp.Anonymous, x: exp.Expression) -> tuple[exp.Expression, exp.Expression]:
    """u256_sum(x) [FILTER (…)] [OVER (…)]: the three limb sums, each with the same clauses,
    carried back into floor form. Returns (node to replace, replacement)."""
    top: exp.Expression = call
    while isinstance(top.parent, (exp.Filter, exp.Window)) and top.parent.this is top:
        top = top.parent
    sums = {f"s{k}": _rewrap(call, top, exp.Sum(this=_field(x, f"l{k}"))) for k in ("2", "1", "0")}
    return top, u256.fill(u256.NORM, **sums)


def _expand(call: exp.Anonymous) -> tuple[exp.Expression, exp.Expression]:
    name = call.name.lower()
    if name not in ARITY:
        raise HelperMisused(f"'{name}' is not a u256 helper (helpers: {', '.join(ARITY)})")
    args = list(call.expressions)
    if len(args) != ARITY[name] or any(isinstance(a, exp.Distinct) for a in args):
        raise HelperMisused(f"{name} takes {ARITY[name]} plain argument(s)")
    x = args[0]
    if name == "u256":
        return call, u256.parse(x, f"{u256.INVALID} in u256()")
    if name == "u256_neg":
        return call, u256.fill(u256.NEG, x=x)
    if name == "u256_add":
        b = args[1]
        sums = {
            f"s{k}": exp.Add(this=_field(x, f"l{k}"), expression=_field(b, f"l{k}"))
            for k in ("2", "1", "0")
        }
        return call, u256.fill(u256.NORM, **sums)
    if name == "u256_sum":
        return _sum(call, x)
    if name == "u256_double":
        return call, u256.fill(u256.DOUBLE, x=x)
    return call, u256.text_of(x)


def expand(tree: exp.Expression) -> exp.Expression:
    """`tree` with every u256 helper call replaced by its native Spark SQL, innermost first."""
    calls = [
        n
        for n in tree.find_all(exp.Anonymous, bfs=False)
        if isinstance(n.this, str) and n.name.lower().startswith("u256")
    ]
    for call in reversed(calls):  # children before their parents
        old, new = _expand(call)
        if old is tree:
            tree = new
        else:
            old.replace(new)
    return tree
