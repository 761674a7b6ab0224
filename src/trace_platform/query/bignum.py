"""Exact amounts in the Query Service: stored amount columns read as DuckDB BIGNUM, and every
BIGNUM in a result leaves as exact decimal text.

- **Reading.** An amount is stored as limbs (`trace_platform.spark.u256`: a struct of nine
  BIGINTs l8 .. l0, the number being sum(l_k * 10^(9k))); its type is its mark. A dataset's view
  turns every column of that type into BIGNUM (`view_expression`: three exact parts added as
  BIGNUM), so `sum`, `+`, `-`, comparisons, ORDER BY, min/max and arg_max are exact over any
  uint256 and any sum of them (`*` and `/` go through DOUBLE in DuckDB: approximate).
- **Results.** DuckDB hands BIGNUM to Arrow as an opaque binary; `to_text` turns every such
  column into strings (exact; JSON never sees a float) with `RESULT_METADATA` on the field, so
  `columns()` can report the type as `bignum`. CSV and Parquet exports carry the same text.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

DIGITS, TOP = 9, 8  # = trace_platform.spark.u256 (not imported here: no Spark in the worker)
LIMBS_TYPE = "STRUCT(" + ", ".join(f"l{k} BIGINT" for k in range(TOP, -1, -1)) + ")"
RESULT_METADATA = {b"trace_type": b"bignum"}


def _q(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


def amount_columns(con: Any, source_sql: str) -> tuple[str, ...]:
    """The columns of `source_sql` (a SELECT) whose type is the limbs struct."""
    rows = con.execute(f"DESCRIBE {source_sql}").fetchall()
    return tuple(str(r[0]) for r in rows if str(r[1]).replace('"', "") == LIMBS_TYPE)


def view_expression(column: str) -> str:
    """DuckDB SQL for the BIGNUM a limbs column holds: l8·10^72 + (l7..l4)·10^36 + (l3..l0),
    the two lower parts exact in HUGEINT (36 digits each), shifted as text, added as BIGNUM
    (floor form needs no sign handling: the sum is the number)."""
    c = _q(column)

    def part(high: int) -> str:
        return " + ".join(
            f"{c}['l{k}']::HUGEINT * {10 ** (DIGITS * (k - high + 3))}"
            for k in range(high, high - 4, -1)
        )

    return (
        f"(({c}['l8']::VARCHAR || repeat('0', {DIGITS * 8}))::BIGNUM"
        f" + (({part(7)})::VARCHAR || repeat('0', {DIGITS * 4}))::BIGNUM"
        f" + ({part(3)})::BIGNUM)"
    )


def is_bignum(t: pa.DataType) -> bool:
    return isinstance(t, pa.OpaqueType) and t.type_name == "bignum"


def decode(blob: bytes) -> int:
    """One DuckDB BIGNUM: a 3-byte header (top bit set for >= 0, then the byte count) and the
    big-endian magnitude; a negative number has header and bytes inverted."""
    body = int.from_bytes(blob[3:], "big")
    if blob[0] & 0x80:
        return body
    return -(body ^ ((1 << (8 * (len(blob) - 3))) - 1))


def _text(chunk: pa.Array) -> pa.Array:
    raw = chunk.storage if isinstance(chunk, pa.ExtensionArray) else chunk
    return pa.array([None if b is None else str(decode(b)) for b in raw.to_pylist()], pa.string())


def to_text(table: pa.Table) -> pa.Table:
    """`table` with every BIGNUM column as exact decimal text (marked `RESULT_METADATA`)."""
    for i, f in enumerate(table.schema):
        if is_bignum(f.type):
            chunks = [_text(c) for c in table.column(i).chunks]
            field = pa.field(f.name, pa.string(), f.nullable, RESULT_METADATA)
            table = table.set_column(i, field, pa.chunked_array(chunks, pa.string()))
    return table


def is_exact_text(field: pa.Field) -> bool:
    """A result column that `to_text` made from a BIGNUM."""
    meta = field.metadata or {}
    return all(meta.get(k) == v for k, v in RESULT_METADATA.items())
