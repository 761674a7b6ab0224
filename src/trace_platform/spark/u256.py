"""Exact integer amounts (any uint256, and any signed sum of them) in Spark.

Three forms, one number, converted only at the edges:

- **On disk** (Parquet): the exact decimal text (`"-123"`, up to 90 digits), a STRING column
  whose Spark field metadata is `AMOUNT_METADATA`. Readable by any tool; the Query Service
  reads marked columns as DuckDB BIGNUM (query/engine.py).
- **In Spark SQL**: the struct `LIMBS` = (l2, l1, l0), three DECIMAL(38,0) limbs base 10^26,
  v = l2·10^52 + l1·10^26 + l0, always in floor form (0 <= l1, l0 < 10^26, l2 signed). A
  uint256 has at most 78 digits, so each of its limbs is below 10^26 and a SUM of up to 10^12
  of them stays inside DECIMAL(38,0) (ANSI mode turns anything larger into an error, never a
  NULL). Floor form is unique and orders like the number, so `=`, `<`, ORDER BY, max/min,
  RANK work on the struct natively.
- **Helpers** for sql_transform authors (`MACROS`, expanded by the SQL guard into the native
  Spark SQL below, so no Python runs per row): `u256(text_or_int)`, `u256_neg(x)`,
  `u256_add(a, b)`, `u256_sum(x)` (aggregate or window), `u256_double(x)` (approximate, for
  ratios) and `u256_text(x)`. Something that would lose digits fails instead: SUM, `+` or
  CAST on the struct are type errors.

`read_amounts` turns marked text columns of an input into limbs (invalid text is an error that
names the dataset, column and value); `write_amounts` turns every limbs column of an output into
marked text.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlglot
from sqlglot import exp

from trace_platform.operators.context import PermanentError

BASE_DIGITS = 26
MAX_DIGITS = 38 + 2 * BASE_DIGITS  # what three DECIMAL(38,0) limbs can carry
AMOUNT_METADATA = {"trace_type": "u256"}
LIMBS = "STRUCT<l2: DECIMAL(38,0), l1: DECIMAL(38,0), l0: DECIMAL(38,0)>"
INVALID = "invalid amount"  # the start of every error an amount that is not an integer raises

_B = str(10**BASE_DIGITS)  # a DECIMAL(27,0) literal to Spark


def _limbs(l2: str, l1: str, l0: str) -> str:
    return (
        f"named_struct('l2', CAST({l2} AS DECIMAL(38,0)), 'l1', CAST({l1} AS DECIMAL(38,0)), "
        f"'l0', CAST({l0} AS DECIMAL(38,0)))"
    )


# Templates over placeholders: __x, __m (limbs), __t (text), __label (a string literal), __s2,
# __s1, __s0 (limb sums). Each is Spark SQL; the guard and the DataFrame edges fill them in.
_PADDED = f"lpad(__d, {MAX_DIGITS}, '0')"
_PARSE_DIGITS = _limbs(
    f"substr({_PADDED}, 1, 38)",
    f"substr({_PADDED}, 39, {BASE_DIGITS})",
    f"substr({_PADDED}, {39 + BASE_DIGITS}, {BASE_DIGITS})",
)
# -(l1·B + l0) borrows one from l2 unless both are 0.
NEG = (
    "CASE WHEN __x IS NULL THEN NULL WHEN __x['l0'] > 0 THEN "
    + _limbs("-__x['l2'] - 1", _B + " - 1 - __x['l1']", _B + " - __x['l0']")
    + " WHEN __x['l1'] > 0 THEN "
    + _limbs("-__x['l2'] - 1", _B + " - __x['l1']", "0")
    + " ELSE "
    + _limbs("-__x['l2']", "0", "0")
    + " END"
)
# Sums of floor-form limbs (all NULL or none): the l1 and l0 sums are >= 0, so the carry is
# a plain DIV and %.
NORM = (
    "CASE WHEN __s0 IS NULL THEN NULL ELSE "
    + _limbs(
        f"__s2 + (__s1 + __s0 DIV {_B}) DIV {_B}",
        f"(__s1 + __s0 DIV {_B}) % {_B}",
        f"__s0 % {_B}",
    )
    + " END"
)
PARSE = (
    "CASE WHEN __t IS NULL THEN NULL "
    f"WHEN NOT __t RLIKE '^-?[0-9]{{1,{MAX_DIGITS}}}$' THEN raise_error(concat(__label, __t)) "
    "WHEN __t LIKE '-%' THEN "
    + NEG.replace("__x", "(" + _PARSE_DIGITS.replace("__d", "substr(__t, 2)") + ")")
    + " ELSE "
    + _PARSE_DIGITS.replace("__d", "__t")
    + " END"
)
# |x| in floor form (l2 >= 0), and the exact text of x given m = |x|.
ABS = "CASE WHEN __x['l2'] < 0 THEN (" + NEG + ") ELSE __x END"
_LPAD = "lpad(CAST(__m['{limb}'] AS STRING), " + str(BASE_DIGITS) + ", '0')"
TEXT = (
    "CASE WHEN __x IS NULL THEN NULL ELSE concat(CASE WHEN __x['l2'] < 0 THEN '-' ELSE '' END, "
    "CASE WHEN __m['l2'] > 0 THEN concat(CAST(__m['l2'] AS STRING), "
    + _LPAD.format(limb="l1")
    + ", "
    + _LPAD.format(limb="l0")
    + ") WHEN __m['l1'] > 0 THEN concat(CAST(__m['l1'] AS STRING), "
    + _LPAD.format(limb="l0")
    + ") ELSE CAST(__m['l0'] AS STRING) END) END"
)
_MAGNITUDE_DOUBLE = (
    "CAST(__m['l2'] AS DOUBLE) * 1e52 + CAST(__m['l1'] AS DOUBLE) * 1e26 "
    "+ CAST(__m['l0'] AS DOUBLE)"
)
# Through |x|: in floor form a small negative number has l2 = -1 and l1, l0 near 10^26, whose
# sum as doubles would cancel catastrophically.
DOUBLE = (
    "CASE WHEN __x['l2'] < 0 THEN -("
    + _MAGNITUDE_DOUBLE.replace("__m", "(" + NEG + ")")
    + ") ELSE "
    + _MAGNITUDE_DOUBLE.replace("__m", "__x")
    + " END"
)


def _parse(template: str) -> exp.Expression:
    from trace_platform.spark.sql_guard import DIALECT

    return sqlglot.parse_one(template, read=DIALECT)


_TEMPLATES: dict[str, exp.Expression] = {}


def fill(template: str, **args: exp.Expression) -> exp.Expression:
    """The template with each placeholder `__name` replaced by a copy of `args[name]`."""
    tree = _TEMPLATES.get(template)
    if tree is None:
        tree = _TEMPLATES[template] = _parse(template)

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and not node.table and node.name.startswith("__"):
            arg = args[node.name[2:]]
            atomic = isinstance(arg, (exp.Column, exp.Literal, exp.Paren))
            return arg.copy() if atomic else exp.Paren(this=arg.copy())
        return node

    return tree.copy().transform(swap, copy=False)


def sql(template: str, **args: exp.Expression) -> str:
    from trace_platform.spark.sql_guard import DIALECT

    return fill(template, **args).sql(dialect=DIALECT)


def text_of(x: exp.Expression) -> exp.Expression:
    """u256_text: the exact decimal text of limbs `x` (NULL stays NULL)."""
    return fill(TEXT, x=x, m=exp.Paren(this=fill(ABS, x=x)))


def parse(text: exp.Expression, label: str) -> exp.Expression:
    """Decimal text (or anything whose STRING cast is one) -> limbs; anything else fails with
    `label: <text>`."""
    return fill(
        PARSE, t=fill("CAST(__v AS STRING)", v=text), label=exp.Literal.string(f"{label}: ")
    )


# --- the DataFrame edges --------------------------------------------------------------------


def is_amount(field: Any) -> bool:
    """A field stored as marked amount text."""
    from pyspark.sql.types import StringType

    meta = field.metadata or {}
    return isinstance(field.dataType, StringType) and all(
        meta.get(k) == v for k, v in AMOUNT_METADATA.items()
    )


def is_limbs(field: Any) -> bool:
    from pyspark.sql.types import DecimalType, StructType

    t = field.dataType
    return (
        isinstance(t, StructType)
        and [f.name for f in t.fields] == ["l2", "l1", "l0"]
        and all(f.dataType == DecimalType(38, 0) for f in t.fields)
    )


def _quoted(name: str) -> exp.Expression:
    return exp.column(exp.to_identifier(name, quoted=True))


def read_amounts(frame: Any, dataset: str) -> Any:
    """Every marked amount column of `frame` as limbs; a value that is not an integer fails the
    job with `invalid amount in <dataset>.<column>: <value>`."""
    from pyspark.sql import functions as F

    for field in frame.schema.fields:
        if is_amount(field):
            label = exp.Literal.string(f"{INVALID} in {dataset}.{field.name}: ")
            frame = frame.withColumn(
                field.name, F.expr(sql(PARSE, t=_quoted(field.name), label=label))
            )
    return frame


def write_amounts(frame: Any) -> Any:
    """Every limbs column of `frame` as marked exact text (its magnitude computed once per row,
    in a column of its own, then dropped)."""
    from pyspark.sql import functions as F

    for field in frame.schema.fields:
        if not is_limbs(field):
            continue
        name, tmp = field.name, f"__abs_{field.name}"
        frame = frame.withColumn(tmp, F.expr(sql(ABS, x=_quoted(name))))
        text = sql(TEXT, x=_quoted(name), m=_quoted(tmp))
        frame = frame.withColumn(name, F.expr(text).alias(name, metadata=AMOUNT_METADATA))
        frame = frame.drop(tmp)
    return frame


def marked(column: Any, name: str) -> Any:
    """A text column as a stored amount named `name`."""
    return column.alias(name, metadata=AMOUNT_METADATA)


@contextlib.contextmanager
def invalid_amounts_fail() -> Iterator[None]:
    """An invalid amount raised inside a Spark job (`raise_error`) as a PermanentError with its
    message: no retry can fix the data."""
    try:
        yield
    except Exception as e:
        if type(e).__module__.startswith(("pyspark", "py4j")) and INVALID in str(e):
            from trace_platform.spark import spark_error_text

            line = next(
                (ln for ln in spark_error_text(e, 20).splitlines() if INVALID in ln), str(e)
            )
            raise PermanentError(line[line.index(INVALID) :].split(" SQLSTATE")[0]) from None
        raise


def keep_marks(frame: Any) -> Any:
    """`frame` with its amount marks re-stated where the optimizer keeps them. Spark's optimizer
    may rewrite a marked column without its metadata (dropDuplicates becomes `first(v) AS v`)
    and the Parquet writer stores the optimized plan's schema, so a plain alias is not enough
    (it is removed as redundant); `concat(v)` is a no-op it keeps."""
    from pyspark.sql import functions as F

    marked = {f.name for f in frame.schema.fields if is_amount(f)}
    if not marked:
        return frame
    return frame.select(
        *[
            F.concat(frame[c]).alias(c, metadata=AMOUNT_METADATA) if c in marked else frame[c]
            for c in frame.columns
        ]
    )
