"""The helper functions sql_transform offers on top of Spark's built-ins: the exact-amount
helpers of `trace_platform.spark.u256`, written like functions, expanded here into native Spark
SQL before the guard checks the query (so the guard and Spark's parser only ever see built-ins,
and no Python runs per row).

    u256(text_or_int)     amount text (or an integer) -> limbs; anything else is an error
    u256_neg(x)           -x
    u256_add(a, b)        a + b
    u256_sum(x)           SUM, as an aggregate (FILTER too) or a window (OVER …)
    u256_double(x)        an approximate DOUBLE, for ratios and charts only
    u256_text(x)          the exact decimal text (a plain STRING: not stored as an amount)

A template that uses its argument many times gets it bound once, as the lambda variable of
`element_at(transform(array(arg), v -> …), 1)`, unless it is a plain column: the expansion
stays linear in the query's size, and Spark evaluates the argument once per row.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import sqlglot
from sqlglot import exp

from trace_platform.spark import u256
from trace_platform.spark.dialect import DIALECT

ARITY: dict[str, int] = {
    "u256": 1,
    "u256_neg": 1,
    "u256_add": 2,
    "u256_sum": 1,
    "u256_double": 1,
    "u256_text": 1,
}


class HelperMisused(ValueError):
    """A u256_… call that is not one of the helpers, or has the wrong arguments (the guard
    refuses the query with this message)."""


class _Expander:
    def __init__(self) -> None:
        self._names = (f"_u256_{i}" for i in itertools.count(1))

    def bind(
        self, arg: exp.Expression, body: Callable[[exp.Expression], exp.Expression]
    ) -> exp.Expression:
        """body(arg), with arg evaluated once: inline for a column, else through a lambda."""
        if isinstance(arg, exp.Column):
            return body(arg)
        var = next(self._names)
        # Parsed from text, so the body refers to the variable as sqlglot's parser would (the
        # guard compares the tree with its regeneration); `arg` goes in after.
        inner = body(exp.column(var)).sql(dialect=DIALECT)
        bound = sqlglot.parse_one(
            f"element_at(transform(array(NULL), {var} -> {inner}), 1)", read=DIALECT
        )
        bound.find(exp.Null).replace(arg.copy())  # type: ignore[union-attr]
        return bound

    def field(self, x: exp.Expression, limb: str) -> exp.Expression:
        inner = x.copy() if isinstance(x, (exp.Column, exp.Paren)) else exp.Paren(this=x.copy())
        return exp.Bracket(this=inner, expressions=[exp.Literal.string(limb)])

    def normalized(self, limb_sum: Callable[[str], exp.Expression]) -> exp.Expression:
        return self.bind(u256.sums(limb_sum), lambda s: u256.fill(u256.NORM, s=s))

    def parse(self, x: exp.Expression) -> exp.Expression:
        if isinstance(x, exp.Literal) or (
            isinstance(x, exp.Neg) and isinstance(x.this, exp.Literal)
        ):
            # The rule a column's text meets at run time (not Python's int(): no '+', spaces,
            # '_' or other scripts' digits), applied now.
            text = x.name if isinstance(x, exp.Literal) else "-" + x.this.name
            if not re.fullmatch(f"-?[0-9]{{1,{u256.TEXT_DIGITS}}}", text, flags=re.ASCII):
                raise HelperMisused(f"{u256.INVALID} in u256(): {text}")
            return u256.constant(int(text))
        text = u256.fill("CAST(__v AS STRING)", v=x)
        label = exp.Literal.string(f"{u256.INVALID} in u256(): ")

        def signed(t: exp.Expression) -> exp.Expression:
            def from_padded(p: exp.Expression) -> exp.Expression:
                magnitude = u256.fill(u256.DIGITS_TO_LIMBS, p=p)
                return self.bind(magnitude, lambda m: u256.fill(u256.SIGNED, m=m, t=t))

            return self.bind(u256.fill(u256.PADDED, t=t, label=label), from_padded)

        return self.bind(text, signed)

    def expand(self, call: exp.Anonymous) -> tuple[exp.Expression, exp.Expression]:
        """(node to replace, its replacement) for one helper call."""
        name = call.name.lower()
        if name not in ARITY:
            raise HelperMisused(f"'{name}' is not a u256 helper (helpers: {', '.join(ARITY)})")
        args = list(call.expressions)
        if len(args) != ARITY[name] or any(isinstance(a, exp.Distinct) for a in args):
            raise HelperMisused(f"{name} takes {ARITY[name]} plain argument(s)")
        x = args[0]
        if name == "u256":
            return call, self.parse(x)
        if name == "u256_neg":
            return call, self.bind(x, lambda v: u256.fill(u256.NEG, x=v))
        if name == "u256_add":
            pair = u256.fill("named_struct('a', __a, 'b', __b)", a=x, b=args[1])

            def add(p: exp.Expression) -> exp.Expression:
                a, b = self.field(p, "a"), self.field(p, "b")
                return self.normalized(
                    lambda f: exp.Add(this=self.field(a, f), expression=self.field(b, f))
                )

            return call, self.bind(pair, add)
        if name == "u256_sum":
            return self.sum(call, x)
        if name == "u256_double":
            return call, self.bind(x, lambda v: u256.fill(u256.DOUBLE, x=v))
        return call, self.bind(x, self.text)

    def text(self, x: exp.Expression) -> exp.Expression:
        def from_magnitude(m: exp.Expression) -> exp.Expression:
            fields = {
                n: u256.fill(t, m=m) for n, t in zip(u256.PAIR_NAMES, u256.PAIRS, strict=True)
            }
            pairs = u256.fill(
                "named_struct(" + ", ".join(f"'{n}', __{n}" for n in u256.PAIR_NAMES) + ")",
                **fields,
            )
            return self.bind(
                pairs,
                lambda q: u256.fill(
                    u256.TEXT, x=x, **{n: self.field(q, n) for n in u256.PAIR_NAMES}
                ),
            )

        return self.bind(u256.fill(u256.ABS, x=x), from_magnitude)

    def sum(self, call: exp.Anonymous, x: exp.Expression) -> tuple[exp.Expression, exp.Expression]:
        """u256_sum(x) [FILTER (…)] [OVER (…)]: one SUM per limb, each with the same clauses,
        carried back into floor form."""
        top: exp.Expression = call
        while isinstance(top.parent, (exp.Filter, exp.Window)) and top.parent.this is top:
            top = top.parent

        def limb_sum(limb: str) -> exp.Expression:
            out, node = exp.Sum(this=self.field(x, limb)), call
            while node is not top:  # the FILTER / OVER clauses, innermost first
                assert node.parent is not None
                node = node.parent
                wrapper = node.copy()
                wrapper.set("this", out)
                out = wrapper
            return out

        return top, self.normalized(limb_sum)


RESERVED = "_u256_"  # the expansion's lambda variables: a user name like them would shadow


def expand(tree: exp.Expression) -> exp.Expression:
    """`tree` with every u256 helper call replaced by its native Spark SQL, innermost first."""
    for ident in tree.find_all(exp.Identifier):
        if ident.name.lower().startswith(RESERVED):
            raise HelperMisused(f"names beginning with {RESERVED} are reserved: {ident.name}")
    expander = _Expander()
    calls = [
        n
        for n in tree.find_all(exp.Anonymous, bfs=False)
        if isinstance(n.this, str) and n.name.lower().startswith("u256")
    ]
    for call in reversed(calls):  # children before their parents
        old, new = expander.expand(call)
        if old is tree:
            tree = new
        else:
            old.replace(new)
    return tree
