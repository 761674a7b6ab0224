"""Exact integer amounts (any uint256, and any signed sum of them): one type, `LIMBS`, on disk
and in Spark.

An amount is the struct of nine BIGINT limbs base 10^9, l8 (signed) down to l0, the number
being sum(l_k * 10^(9k)), always in floor form (0 <= l0..l7 < 10^9). A uint256 has at most 78
digits, so its l8 < 10^6 and every limb is below 10^9: a SUM of up to 9.2·10^9 of them stays
inside BIGINT (ANSI mode turns anything larger into an error, never a NULL). Floor form is
unique and orders like the number, so `=`, `<`, ORDER BY, max/min and RANK work on the struct
as it is.

- **On disk** the struct is the column (Parquet stores it as nine INT64 leaves; zero limbs
  cost almost nothing). Its type is its mark: the Query Service reads every column of this type
  as DuckDB BIGNUM (query/bignum.py) and answers with exact text. There is no decimal text on
  disk: making it and parsing it again at every Spark edge cost more than the arithmetic
  (docs/benchmarks.md, "Exact amounts").
- **In Spark** the arithmetic stays in primitive longs (DECIMAL(38,0) limbs allocate a
  BigDecimal per operation). sql_transform authors use the helpers
  (`trace_platform.spark.helpers`, expanded by the SQL guard into the native Spark SQL below):
  `u256(text_or_int)`, `u256_neg(x)`, `u256_add(a, b)`, `u256_sum(x)` (aggregate or window),
  `u256_double(x)` (approximate, for ratios) and `u256_text(x)`. What would lose digits fails
  instead: SUM, `+` or CAST on the struct are type errors.
- **From the chain** `trace_platform.spark.words` turns 32-byte ABI words into limbs on whole
  Arrow batches (the decode's `mapInArrow`: numpy, no Python per row, no text in between).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlglot
from sqlglot import exp

from trace_platform.operators.context import PermanentError
from trace_platform.spark import spark_error_text
from trace_platform.spark.dialect import DIALECT

DIGITS = 9  # per limb
TOP = 8  # limbs l8 (the signed top one) .. l0
BASE = 10**DIGITS
MAX_DIGITS = 19 + TOP * DIGITS  # a BIGINT top limb and eight full ones
# Text u256() reads: one digit fewer than MAX_DIGITS, so the top 19 always fit a BIGINT (far
# past any sum of uint256 amounts: 78 digits, 90 with 10^12 of them).
TEXT_DIGITS = MAX_DIGITS - 1
TEXT_PATTERN = f"^-?[0-9]{{1,{TEXT_DIGITS}}}\\\\z"  # as a Spark SQL string literal
FIELDS = [f"l{k}" for k in range(TOP, -1, -1)]  # high to low: struct order = numeric order
LIMBS = "STRUCT<" + ", ".join(f"{f}: BIGINT" for f in FIELDS) + ">"
INVALID = "invalid amount"  # the start of every error a value that is not an amount raises

_B = str(BASE)


def _f(x: str, k: int) -> str:
    return f"{x}['l{k}']"


def _limbs(fields: list[str]) -> str:
    """A limbs struct from its field expressions, high to low."""
    inner = ", ".join(f"'{n}', CAST({e} AS BIGINT)" for n, e in zip(FIELDS, fields, strict=True))
    return f"named_struct({inner})"


def _neg() -> str:
    """-x in floor form: below the lowest nonzero limb j nothing changes, limb j becomes
    B - l_j, the limbs above it B - 1 - l_k, and l8 borrows one unless x's low limbs are all 0.
    One struct of nine small expressions (the limbs are >= 0, so "all lower limbs are 0" is
    "their sum is 0"): compact code that the JIT compiles."""

    def lower_zero(k: int) -> str:
        return "(" + " + ".join(_f("__x", j) for j in range(k)) + ") = 0"

    fields = [f"-{_f('__x', TOP)} - CASE WHEN {lower_zero(TOP)} THEN 0 ELSE 1 END"]
    for k in range(TOP - 1, -1, -1):
        own = f"CASE WHEN {_f('__x', k)} = 0 THEN 0 ELSE {_B} - {_f('__x', k)} END"
        fields.append(
            own
            if k == 0
            else f"CASE WHEN {lower_zero(k)} THEN {own} ELSE {_B} - 1 - {_f('__x', k)} END"
        )
    return f"CASE WHEN __x IS NULL THEN NULL ELSE {_limbs(fields)} END"


def _norm() -> str:
    """Limb sums (a struct s8..s0, s0..s7 >= 0, the form sums of floor-form limbs have) carried
    back into floor form: t_k = s_k + t_(k-1) DIV B, limb k = t_k % B, l8 = s8 + t_7 DIV B."""
    t: list[str] = []
    for k in range(TOP):
        s = f"__s['s{k}']"
        t.append(s if k == 0 else f"({s} + ({t[k - 1]}) DIV {_B})")
    fields = [f"__s['s{TOP}'] + ({t[TOP - 1]}) DIV {_B}"]
    fields += [f"({t[k]}) % {_B}" for k in range(TOP - 1, -1, -1)]
    return f"CASE WHEN __s['s0'] IS NULL THEN NULL ELSE {_limbs(fields)} END"


def _padded() -> str:
    """Decimal text __t (an optional '-' and 1 to TEXT_DIGITS digits) as its digits, left-padded
    to MAX_DIGITS; anything else raises `__label` and the text. `\\z`, not `$`: Java's `$` also
    matches before a final line break, which would shift every digit."""
    digits = "CASE WHEN __t LIKE '-%' THEN substr(__t, 2) ELSE __t END"
    return (
        "CASE WHEN __t IS NULL THEN NULL "
        f"WHEN NOT __t RLIKE '{TEXT_PATTERN}' THEN raise_error(concat(__label, __t)) "
        f"ELSE lpad({digits}, {MAX_DIGITS}, '0') END"
    )


def _digits() -> str:
    """Padded digits __p as limbs: five BIGINT casts (the top 19 digits, then 18-digit pairs of
    limbs split with DIV and %): each cast of a substring costs more than the arithmetic."""
    pairs = [f"CAST(substr(__p, {20 + 2 * DIGITS * i}, {2 * DIGITS}) AS BIGINT)" for i in range(4)]
    fields = ["CAST(substr(__p, 1, 19) AS BIGINT)"]
    for pair in pairs:
        fields += [f"{pair} DIV {_B}", f"{pair} % {_B}"]
    return _limbs(fields)


PAIR_NAMES = ["top", "p3", "p2", "p1", "p0"]


def _pairs() -> list[str]:
    """Magnitude __m as its top limb and four 18-digit pairs of limbs (a BIGINT each)."""
    pairs = [f"{_f('__m', k + 1)} * {_B} + {_f('__m', k)}" for k in range(TOP - 2, -1, -2)]
    return [_f("__m", TOP), *pairs]


def _text() -> str:
    """The text of __x given its magnitude's pairs __top, __p3 .. __p0 (`PAIRS`): the sign, then
    the digits from the highest nonzero part (casting a long is the cheap path to text)."""
    parts = [f"__{n}" for n in PAIR_NAMES]
    branches = []
    for i, part in enumerate(parts[:-1]):
        rest = [f"lpad(CAST({p} AS STRING), {2 * DIGITS}, '0')" for p in parts[i + 1 :]]
        branches.append(f"WHEN {part} > 0 THEN concat(CAST({part} AS STRING), {', '.join(rest)})")
    digits = f"CASE {' '.join(branches)} ELSE CAST({parts[-1]} AS STRING) END"
    sign = f"CASE WHEN {_f('__x', TOP)} < 0 THEN '-' ELSE '' END"
    return f"CASE WHEN __x IS NULL THEN NULL ELSE concat({sign}, {digits}) END"


def _double() -> str:
    """An approximate DOUBLE. A negative number goes through B - 1 - l_k (small, positive):
    summing its floor-form limbs as doubles would cancel catastrophically."""
    pos = " + ".join(f"CAST({_f('__x', k)} AS DOUBLE) * 1e{DIGITS * k}" for k in range(TOP + 1))
    below = " + ".join(
        f"CAST({_B} - 1 - {_f('__x', k)} AS DOUBLE) * 1e{DIGITS * k}" for k in range(TOP)
    )
    neg = f"CAST({_f('__x', TOP)} + 1 AS DOUBLE) * 1e{DIGITS * TOP} - ({below} + 1)"
    return f"CASE WHEN {_f('__x', TOP)} < 0 THEN {neg} ELSE {pos} END"


# Templates over placeholders (__x, __m: limbs, __m a magnitude; __s: a struct of limb sums
# s8..s0; __t: text; __p: padded digits; __top, __p3 .. __p0: a magnitude's PAIRS; __label: a
# string literal). A placeholder used many times must be given a
# column (or a lambda variable: helpers.bind), never an expression. The guard's helpers and the
# DataFrame edges fill them in.
NEG = _neg()
NORM = _norm()
PADDED = _padded()
DIGITS_TO_LIMBS = _digits()
SIGNED = (
    f"CASE WHEN __t IS NULL THEN NULL WHEN __t LIKE '-%' THEN ({NEG.replace('__x', '__m')}) "
    "ELSE __m END"
)
ABS = f"CASE WHEN {_f('__x', TOP)} < 0 THEN ({NEG}) ELSE __x END"
PAIRS = _pairs()  # one template per pair
TEXT = _text()
DOUBLE = _double()

_TEMPLATES: dict[str, exp.Expression] = {}


def _tree(template: str) -> exp.Expression:
    tree = _TEMPLATES.get(template)
    if tree is None:
        tree = _TEMPLATES[template] = sqlglot.parse_one(template, read=DIALECT)
    return tree


def fill(template: str, **args: exp.Expression) -> exp.Expression:
    """The template with each placeholder `__name` replaced by a copy of `args[name]`."""

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and not node.table and node.name[2:] in args:
            arg = args[node.name[2:]]
            atomic = isinstance(arg, (exp.Column, exp.Literal, exp.Paren))
            return arg.copy() if atomic else exp.Paren(this=arg.copy())
        return node

    return _tree(template).copy().transform(swap, copy=False)


def sql(template: str, **args: exp.Expression) -> str:
    return fill(template, **args).sql(dialect=DIALECT)


_SUMS = "named_struct(" + ", ".join(f"'s{k}', __s{k}" for k in range(TOP, -1, -1)) + ")"


def sums(limb_sum: Any) -> exp.Expression:
    """A struct s8..s0 of `limb_sum(field)` for each limb field (for NORM)."""
    return fill(_SUMS, **{f"s{k}": limb_sum(f"l{k}") for k in range(TOP + 1)})


def constant(value: int) -> exp.Expression:
    """The limbs of an integer known now (a literal in the query), as constants."""
    if abs(value) >= 10**TEXT_DIGITS:
        raise ValueError(f"{value} has more than {TEXT_DIGITS} digits")
    v, fields = value, []
    for _ in range(TOP):
        v, limb = divmod(v, BASE)  # floor division: floor form
        fields.append(str(limb))
    return sqlglot.parse_one(_limbs([str(v), *reversed(fields)]), read=DIALECT)


# --- the DataFrame side ---------------------------------------------------------------------


def is_limbs(field: Any) -> bool:
    """A field holding amounts."""
    from pyspark.sql.types import LongType, StructType

    t = field.dataType
    return (
        isinstance(t, StructType)
        and [f.name for f in t.fields] == FIELDS
        and all(isinstance(f.dataType, LongType) for f in t.fields)
    )


def column(name: str) -> exp.Expression:
    """A column reference to fill a template with."""
    return exp.column(exp.to_identifier(name, quoted=True))


@contextlib.contextmanager
def invalid_amounts_fail() -> Iterator[None]:
    """An invalid amount raised inside a Spark job (`raise_error`) as a PermanentError with its
    message: no retry can fix the data."""
    try:
        yield
    except Exception as e:
        if not type(e).__module__.startswith(("pyspark", "py4j")):
            raise
        text = spark_error_text(e, 20)
        if INVALID in str(e):
            line = next((ln for ln in text.splitlines() if INVALID in ln), str(e))
            raise PermanentError(line[line.index(INVALID) :].split(" SQLSTATE")[0]) from None
        for kind in DETERMINISTIC:  # the same data fails the same way: no retry can help
            if kind in text:
                line = next(ln for ln in text.splitlines() if kind in ln)
                raise PermanentError(f"{INVALID}: {line.split(' SQLSTATE')[0].strip()}") from None
        raise


# Spark errors the data itself causes (ANSI mode): an amount or a sum past what limbs hold.
DETERMINISTIC = ("ARITHMETIC_OVERFLOW", "CAST_INVALID_INPUT", "CAST_OVERFLOW")
