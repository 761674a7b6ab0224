"""Query results as JSON rows (exact: big integers and decimals as strings), CSV or Parquet."""

from __future__ import annotations

import datetime as dt
import decimal
import io
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

FORMATS = ("json", "csv", "parquet")


def _cell(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        return str(v)  # exact; a JSON float would round a uint256
    if isinstance(v, bytes | bytearray | memoryview):
        return "0x" + bytes(v).hex()
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, int) and abs(v) > 2**53:
        return str(v)
    if isinstance(v, list):
        return [_cell(x) for x in v]
    if isinstance(v, dict):
        return {k: _cell(x) for k, x in v.items()}
    return v


def _json_column(col: pa.ChunkedArray) -> list[Any]:
    """One column as JSON-safe values, converted by Arrow where it can (fast) and cell by cell
    only for the types that need it."""
    t = col.type
    if pa.types.is_decimal(t) or pa.types.is_temporal(t):
        return pc.cast(col, pa.string()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_integer(t) and col.length() and t.bit_width == 64:
        lo, hi = pc.min_max(col).values()
        if (hi.as_py() or 0) > 2**53 or (lo.as_py() or 0) < -(2**53):
            return pc.cast(col, pa.string()).to_pylist()  # type: ignore[no-any-return]
        return col.to_pylist()  # type: ignore[no-any-return]
    if (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    ):
        return col.to_pylist()  # type: ignore[no-any-return]
    return [_cell(v) for v in col.to_pylist()]


def columns(table: pa.Table) -> list[dict[str, str]]:
    return [{"name": f.name, "type": str(f.type)} for f in table.schema]


def rows(table: pa.Table) -> list[list[Any]]:
    cols = [_json_column(table.column(i)) for i in range(table.num_columns)]
    return [list(r) for r in zip(*cols, strict=True)] if cols else []


def _csv_safe(table: pa.Table) -> pa.Table:
    """CSV has no binary type: bytes columns become 0x-hex text."""
    out = table
    for i, f in enumerate(table.schema):
        if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type):
            values = [None if v is None else "0x" + v.hex() for v in table.column(i).to_pylist()]
            out = out.set_column(i, f.name, pa.array(values, pa.string()))
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
