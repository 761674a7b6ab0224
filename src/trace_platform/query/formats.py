"""Query results as JSON rows (exact: big integers and decimals as strings), CSV or Parquet.

Exact amounts (DuckDB BIGNUM) arrive as decimal text already (`bignum.to_text`, in the query
worker): JSON strings, CSV text, Parquet strings, reported with the type `bignum`."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from trace_platform.query.bignum import is_exact_text

FORMATS = ("json", "csv", "parquet")


def _cell(v: Any) -> Any:
    """One value as JSON-safe, exact data: big numbers as strings, bytes as 0x-hex, and a
    string for anything JSON has no type for (NaN, intervals, …)."""
    if v is None or isinstance(v, bool | str):
        return v
    if isinstance(v, int):
        return str(v) if abs(v) > 2**53 else v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)  # "nan", "inf": JSON has neither
    if isinstance(v, decimal.Decimal):
        return str(v)  # exact; a JSON float would round a uint256
    if isinstance(v, bytes | bytearray | memoryview):
        return "0x" + bytes(v).hex()
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, list | tuple):
        return [_cell(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _cell(x) for k, x in v.items()}
    return str(v)


def _json_column(col: pa.ChunkedArray) -> list[Any]:
    """One column as JSON-safe values: Arrow converts the common flat types in bulk; anything
    else (nested, intervals, floats that may be NaN) goes cell by cell."""
    t = col.type
    if pa.types.is_decimal(t):
        return pc.cast(col, pa.string()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_integer(t) and col.length() and t.bit_width == 64:
        lo, hi = pc.min_max(col).values()
        if (hi.as_py() or 0) > 2**53 or (lo.as_py() or 0) < -(2**53):
            return pc.cast(col, pa.string()).to_pylist()  # type: ignore[no-any-return]
        return col.to_pylist()  # type: ignore[no-any-return]
    if (
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    ):
        return col.to_pylist()  # type: ignore[no-any-return]
    return [_cell(v) for v in col.to_pylist()]


def columns(table: pa.Table) -> list[dict[str, str]]:
    return [
        {"name": f.name, "type": "bignum" if is_exact_text(f) else str(f.type)}
        for f in table.schema
    ]


def rows(table: pa.Table) -> list[list[Any]]:
    cols = [_json_column(table.column(i)) for i in range(table.num_columns)]
    return [list(r) for r in zip(*cols, strict=True)] if cols else []


def _csv_safe(table: pa.Table) -> pa.Table:
    """CSV has only flat text: bytes become 0x-hex, nested and other types JSON text."""
    out = table
    for i, f in enumerate(table.schema):
        t = f.type
        flat = (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or pa.types.is_boolean(t)
            or pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_decimal(t)
            or pa.types.is_timestamp(t)
            or pa.types.is_date(t)
        )
        if flat:
            continue
        values = [_cell(v) for v in table.column(i).to_pylist()]
        text = [None if v is None else v if isinstance(v, str) else json.dumps(v) for v in values]
        out = out.set_column(i, f.name, pa.array(text, pa.string()))
    return out


def encode(table: pa.Table, fmt: str) -> bytes:
    buf = io.BytesIO()
    if fmt == "csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(_csv_safe(table), buf)
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, buf)
    else:
        raise ValueError(f"unknown format '{fmt}' (one of {', '.join(FORMATS)})")
    return buf.getvalue()


MEDIA_TYPES = {"csv": "text/csv", "parquet": "application/vnd.apache.parquet"}
