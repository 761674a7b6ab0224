"""Query results as JSON rows (exact: big integers and decimals as strings), CSV or Parquet."""

from __future__ import annotations

import datetime as dt
import decimal
import io
from typing import Any

import pyarrow as pa

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


def columns(table: pa.Table) -> list[dict[str, str]]:
    return [{"name": f.name, "type": str(f.type)} for f in table.schema]


def rows(table: pa.Table) -> list[list[Any]]:
    cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return [[_cell(c[r]) for c in cols] for r in range(table.num_rows)]


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
