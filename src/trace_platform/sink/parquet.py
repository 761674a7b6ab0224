"""What a Parquet batch may decode to, known before any of its data is decoded. The footer's
sizes are the writer's claims; the page headers' are what the decoder itself allocates by
(a page never decompresses to more than its header says), so both are read: the footer to
refuse an honest bomb at once, every page header (Thrift compact protocol, a few bytes each,
no page body touched) to refuse one whose footer lies. What pages may still expand into (a
dictionary's values repeated by RLE indices, DELTA_BYTE_ARRAY prefixes, a list column's values
multiplied by its levels) is bounded by `Plan`: dictionaries are read as dictionaries, batches
are small enough that one never holds more than the bound, and the caller counts every
batch's values as they would be once expanded (`dense_bytes`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Page types and the one encoding that expands a page's values beyond the page (parquet.thrift).
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
_DELTA_BYTE_ARRAY = 7
_DICTIONARY_READABLE = {0, 2, 8}  # PLAIN, PLAIN_DICTIONARY, RLE_DICTIONARY
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
_MAX_PAGES = 100_000  # a legitimate batch has a few per column; each costs a header parse
_MAX_BATCH_ROWS = 4096
_OLD_PARQUET_MR = re.compile(r"^\s*parquet-mr\s+version\s+(\d+)\.(\d+)\.(\d+)", re.IGNORECASE)


class Refused(ValueError):
    """The file is refused before decoding: this text says why, for its user."""


class _Malformed(Exception):
    pass


@dataclass
class Plan:
    """How to decode a file that passed: these columns as dictionaries, this many rows a
    batch."""

    dictionary_paths: list[str] = field(default_factory=list)
    batch_rows: int = _MAX_BATCH_ROWS


def plan(data: bytes, meta: Any, schema: Any, max_decoded: int) -> Plan:
    """Refuses (`Refused`) a file whose footer or pages say it decompresses to more than
    `max_decoded` bytes, or whose list columns hold more values than that many bytes could;
    else how to decode it without any batch expanding past the bound."""
    bound = f"the platform's TRACE_SINK_MAX_BATCH_BYTES ({max_decoded})"
    claimed = sum(
        meta.row_group(g).column(c).total_uncompressed_size
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
    )
    claimed = max(
        claimed, sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
    )
    if claimed > max_decoded:
        raise Refused(f"the batch's footer says it decodes to {claimed} bytes, over {bound}")
    m = _OLD_PARQUET_MR.match(meta.created_by or "")
    if m and tuple(map(int, m.groups())) < (1, 2, 9):
        # The decoder pads such files' column chunks past their stated end (PARQUET-816).
        raise Refused(f"the batch was written by {meta.created_by!r}, older than parquet-mr 1.2.9")
    columns = [schema.column(c) for c in range(meta.num_columns)]
    chunks: list[list[_Chunk]] = []
    total = pages = 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        chunks.append([])
        for c in range(len(columns)):
            chunk = _chunk(data, rg.column(c))
            chunks[-1].append(chunk)
            pages += chunk.pages
            if pages > _MAX_PAGES:
                raise Refused(f"the batch has more than {_MAX_PAGES} pages")
            total += chunk.decompressed
            if total > max_decoded:
                raise Refused(
                    f"the batch's pages decompress to more than {max_decoded} bytes, over {bound}"
                )
    # Byte-array columns with a dictionary are read as dictionaries (no value repeated in
    # memory), when all their pages are in encodings the decoder can keep as one.
    as_dictionary = {
        c
        for c, col in enumerate(columns)
        if col.physical_type == "BYTE_ARRAY"
        and any(g[c].dictionary for g in chunks)
        and all(g[c].encodings <= _DICTIONARY_READABLE for g in chunks)
    }
    expanding = 0  # the most one row's values may expand to, read as planned
    for group in chunks:
        row = 0
        for c, (col, chunk) in enumerate(zip(columns, group, strict=True)):
            # A value expands past what its page stores only from a dictionary (not read as
            # one) or DELTA_BYTE_ARRAY prefixes; either way it is at most its largest page.
            expands = chunk.delta or (chunk.dictionary and c not in as_dictionary)
            if col.max_repetition_level > 0:  # a list: its values are not one a row
                width = _WIDTH.get(col.physical_type, col.length or 0)
                each = chunk.largest_page if expands else max(width, 8)
                if chunk.values * each > max_decoded:
                    raise Refused(
                        f"list column '{col.path}' holds {chunk.values} values that may decode "
                        f"to more than {max_decoded} bytes, over {bound}"
                    )
            elif expands:
                row += chunk.largest_page
        expanding = max(expanding, row)
    rows = max(1, min(_MAX_BATCH_ROWS, max_decoded // expanding)) if expanding else _MAX_BATCH_ROWS
    return Plan([columns[c].path for c in sorted(as_dictionary)], rows)


@dataclass
class _Chunk:
    pages: int = 0
    decompressed: int = 0
    largest_page: int = 0
    values: int = 0
    delta: bool = False
    dictionary: bool = False
    encodings: set[int] = field(default_factory=set)


def _chunk(data: bytes, cc: Any) -> _Chunk:
    """A column chunk's page headers, walked over the bytes the decoder reads for it (none
    when it holds no values: the decoder reads no page of it then)."""
    if cc.num_values == 0:
        return _Chunk()
    start = cc.data_page_offset
    if cc.has_dictionary_page and 0 < (cc.dictionary_page_offset or 0) < start:
        start = cc.dictionary_page_offset
    end = start + cc.total_compressed_size
    if not 0 <= start < end <= len(data):
        raise Refused(f"a column chunk of the batch lies outside it ({start}..{end})")
    out, pos = _Chunk(), start
    try:
        while pos < end:
            header, pos = _struct(data, pos, 0)
            kind, size, stored = header.get(1), header.get(2), header.get(3)
            if not isinstance(size, int) or not isinstance(stored, int) or size < 0 or stored < 0:
                raise _Malformed
            pos += stored
            if pos > end:
                raise _Malformed
            out.pages += 1
            out.decompressed += size
            out.largest_page = max(out.largest_page, size)
            out.dictionary |= kind == _DICTIONARY_PAGE
            if kind in (_DATA_PAGE, _DATA_PAGE_V2):
                sub = header.get(5 if kind == _DATA_PAGE else 8)
                if not isinstance(sub, dict) or not isinstance(sub.get(1), int) or sub[1] < 0:
                    raise _Malformed
                out.values += sub[1]
                encoding = sub.get(2 if kind == _DATA_PAGE else 4)
                out.encodings.add(encoding if isinstance(encoding, int) else -1)
                out.delta |= encoding == _DELTA_BYTE_ARRAY
            if out.pages > _MAX_PAGES:
                break  # the caller refuses
    except (_Malformed, IndexError, RecursionError):
        raise Refused(f"a page header of the batch at byte {pos} is not Parquet's") from None
    return out


# -- Thrift compact protocol: just enough to read a PageHeader and skip what it does not need --


def _varint(b: bytes, p: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        x = b[p]
        p += 1
        out |= (x & 0x7F) << shift
        if not x & 0x80:
            return out, p
        shift += 7
        if shift > 63:
            raise _Malformed


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _value(b: bytes, p: int, t: int, depth: int) -> tuple[Any, int]:
    if t in (1, 2):  # a struct field's boolean is in its type
        return t == 1, p
    if t == 3:
        return b[p], p + 1
    if t in (4, 5, 6):
        n, p = _varint(b, p)
        return _zigzag(n), p
    if t == 7:
        return None, p + 8
    if t == 8:
        n, p = _varint(b, p)
        if p + n > len(b):
            raise _Malformed
        return None, p + n
    if t in (9, 10):  # list, set
        head = b[p]
        p += 1
        n, elem = head >> 4, head & 0x0F
        if n == 15:
            n, p = _varint(b, p)
        for _ in range(n):
            p = p + 1 if elem in (1, 2) else _value(b, p, elem, depth + 1)[1]
        return None, p
    if t == 11:  # map
        n, p = _varint(b, p)
        if n:
            kinds = b[p]
            p += 1
            for _ in range(n):
                p = _value(b, p, kinds >> 4, depth + 1)[1]
                p = _value(b, p, kinds & 0x0F, depth + 1)[1]
        return None, p
    if t == 12:
        return _struct(b, p, depth + 1)
    raise _Malformed


def _struct(b: bytes, p: int, depth: int) -> tuple[dict[int, Any], int]:
    """A struct's integer, boolean and struct fields by id (others skipped)."""
    if depth > 16:
        raise _Malformed
    fields: dict[int, Any] = {}
    fid = 0
    while True:
        head = b[p]
        p += 1
        if head == 0:  # STOP
            return fields, p
        t, delta = head & 0x0F, head >> 4
        if delta:
            fid += delta
        else:
            n, p = _varint(b, p)
            fid = _zigzag(n)
        fields[fid], p = _value(b, p, t, depth)


def dense_bytes(array: Any) -> int:
    """What `array` holds once every dictionary is expanded (as `to_pylist` expands it),
    counted without expanding it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = array.type
    if pa.types.is_dictionary(t):
        values, indices = array.dictionary, array.indices
        if len(values) == 0 or len(indices) == 0:
            return 8 * len(array)
        if (
            pa.types.is_binary(values.type)
            or pa.types.is_string(values.type)
            or pa.types.is_large_binary(values.type)
            or pa.types.is_large_string(values.type)
        ):
            total = pc.sum(pc.take(pc.binary_length(values), indices)).as_py() or 0
            return int(total) + 8 * len(array)
        return len(array) * max(dense_bytes(values) // len(values), 1) + dense_bytes(values)
    if pa.types.is_struct(t):
        return sum(dense_bytes(array.field(i)) for i in range(t.num_fields)) + len(array)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return dense_bytes(array.flatten()) + 8 * len(array)
    return int(array.nbytes)
