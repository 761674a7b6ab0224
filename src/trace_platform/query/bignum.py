"""Exact amounts in the Query Service: stored amount columns read as DuckDB BIGNUM, and every
BIGNUM in a result leaves as exact decimal text.

- **Reading.** Spark marks an amount column (exact decimal text) in the field metadata it
  writes into each Parquet footer (`trace_platform.spark.u256.AMOUNT_METADATA`). A dataset's
  view casts those columns to BIGNUM, so `sum`, `+`, `-`, comparisons, ORDER BY, min/max and
  arg_max are exact over any uint256 and any sum of them (`*` and `/` go through DOUBLE in
  DuckDB: approximate).
- **Results.** DuckDB hands BIGNUM to Arrow as an opaque binary; `to_text` turns every such
  column into strings (exact; JSON never sees a float) with `RESULT_METADATA` on the field, so
  `columns()` can report the type as `bignum`. CSV and Parquet exports carry the same text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

SPARK_SCHEMA_KEY = "org.apache.spark.sql.parquet.row.metadata"
AMOUNT_METADATA = {"trace_type": "u256"}  # = trace_platform.spark.u256.AMOUNT_METADATA
RESULT_METADATA = {b"trace_type": b"bignum"}


def amount_columns(con: Any, files: Iterable[str]) -> tuple[str, ...]:
    """The columns marked as amounts in these Parquet files' footers (any of them)."""
    files = list(files)
    if not files:
        return ()
    rows = con.execute(
        "SELECT DISTINCT decode(value) FROM parquet_kv_metadata(?) WHERE decode(key) = ?",
        [files, SPARK_SCHEMA_KEY],
    ).fetchall()
    found: list[str] = []
    for (raw,) in rows:
        for f in json.loads(raw).get("fields", []):
            meta = f.get("metadata") or {}
            marked = all(meta.get(k) == v for k, v in AMOUNT_METADATA.items())
            if marked and f.get("type") == "string" and f["name"] not in found:
                found.append(f["name"])
    return tuple(found)


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
