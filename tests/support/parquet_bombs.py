"""Parquet batches that are small as stored and enormous decoded, for the sink's tests. Each is
built without ever holding its decoded size (the dictionary and list ones from their indices),
and each names the reason the sink must refuse it with, given a bound of `LIMIT` bytes (every
reason also names TRACE_SINK_MAX_BATCH_BYTES)."""

from __future__ import annotations

import io
import struct
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

LIMIT = 1024 * 1024  # the sink's TRACE_SINK_MAX_BATCH_BYTES in these tests
HUGE_CELL = 16 * 1024 * 1024


def parquet(table: pa.Table, **kw: Any) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, **kw)
    return buf.getvalue()


def _varint(n: int, width: int = 0) -> bytes:
    """Thrift's unsigned varint of `n`, padded to `width` bytes (a longer, equal encoding)."""
    groups = []
    while True:
        groups.append(n & 0x7F)
        n >>= 7
        if not n:
            break
    groups += [0] * (width - len(groups))
    return bytes([g | 0x80 for g in groups[:-1]] + [groups[-1]])


def lying_footer(data: bytes, claimed: int, says: int) -> bytes:
    """`data` with every size of `claimed` bytes in its footer rewritten to say `says`."""
    (length,) = struct.unpack("<I", data[-8:-4])
    footer = data[-8 - length : -8]
    was = _varint(2 * claimed)  # a zigzag i64
    assert was in footer, "the size is not in the footer"
    footer = footer.replace(was, _varint(2 * says, len(was)))
    return data[: -8 - length] + footer + data[-8:]


def one_huge_cell() -> bytes:
    """One row whose one string is 16 MiB (zstd: under 4 KB stored), its compressed frames
    broken: decoding any of it fails otherwise than the refusal, so the refusal shows that
    nothing was decoded."""
    data = parquet(pa.table({"k": ["x" * HUGE_CELL]}), compression="zstd")
    return data.replace(b"\x28\xb5\x2f\xfd", b"\x28\xb5\x2f\x00")  # zstd's frame magic


def footer_lies() -> bytes:
    """The same cell, intact, with a footer that says its column is 100 bytes."""
    data = parquet(pa.table({"k": ["x" * HUGE_CELL]}), compression="zstd")
    claimed = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0)
    return lying_footer(data, claimed.total_uncompressed_size, 100)


def repeated_dictionary_value(arrow_schema: bool = True) -> bytes:
    """20,000 rows all pointing at one 100 KB dictionary value (2 GB expanded; ~500 bytes
    stored): honest footer, small pages, all of the size in the repetition. With its Arrow
    schema pyarrow reads it back as a dictionary by itself; without, only if asked to."""
    values = pa.DictionaryArray.from_arrays(
        pa.array([0] * 20_000, pa.int32()), pa.array(["y" * 100_000])
    )
    return parquet(pa.table({"k": values}), compression="zstd", store_schema=arrow_schema)


def list_of_repeated_values() -> bytes:
    """One row whose json column is a list of a million equal numbers (RLE: ~1 KB stored)."""
    n = 1_000_000
    doc = pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), pa.repeat(7, n))
    return parquet(pa.table({"k": ["a"], "doc": doc}), compression="zstd")


# name -> (its bytes, the reason the sink refuses it with)
BOMBS = {
    "one_huge_cell": (
        one_huge_cell,
        "the batch's footer says it decodes to",
    ),
    "footer_lies": (
        footer_lies,
        f"the batch's pages decompress to more than {LIMIT} bytes",
    ),
    "repeated_dictionary_value": (
        repeated_dictionary_value,
        f"the batch decodes to more than {LIMIT} bytes",
    ),
    "repeated_dictionary_value_no_arrow_schema": (
        lambda: repeated_dictionary_value(arrow_schema=False),
        f"the batch decodes to more than {LIMIT} bytes",
    ),
    "list_of_repeated_values": (
        list_of_repeated_values,
        "list column 'doc.list.element' holds 1000000 values that may decode to more than",
    ),
}
