"""A published batch read and checked against its dataset's declared columns. Everything in
it is a claim of untrusted code: types, required columns, row and byte bounds are checked
before anything is written, and `org_id` in a row is never taken (the record's org is)."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from psycopg.types.json import Jsonb

from trace_platform.dag.schema import BUFFER_RESERVED
from trace_platform.sink import parquet

_UINT256_MAX = 2**256 - 1
_INT64 = (-(2**63), 2**63 - 1)
_LIMBS = [f"l{k}" for k in range(8, -1, -1)]  # the limbs struct of exact amounts (spark/u256)


class BatchRefused(ValueError):
    """The batch does not fit its dataset: dead-lettered with this text, for its user."""


def parse(data: bytes, content_type: str, max_rows: int, max_decoded: int) -> list[dict[str, Any]]:
    """The batch's rows as dicts (JSONL: one object a line; Parquet: its rows, refused before
    any decoding when its footer or page headers say it decompresses to more than
    `max_decoded` bytes, then decoded in batches small enough that none expands past the
    bound, and refused once they hold more: a small, highly compressed file never expands in
    full, nor does one whose footer lies)."""
    if content_type == "application/jsonl":
        return _jsonl(data, max_rows)  # as decoded as it is stored: `data` is the bound
    return _parquet(data, max_rows, max_decoded)


def _jsonl(data: bytes, max_rows: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BatchRefused(f"the batch is not UTF-8 text ({e.reason} at byte {e.start})") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(rows) >= max_rows:
            raise BatchRefused(f"the batch has more than {max_rows} rows (the dataset's max_rows)")
        try:
            row = _DECODER.decode(line)
        except (ValueError, RecursionError) as e:
            raise BatchRefused(f"line {n} is not JSON: {e}") from None
        if not isinstance(row, dict):
            raise BatchRefused(f"line {n} is a JSON {type(row).__name__}, not an object")
        rows.append(row)
    return rows


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


# One decoder for every line (json.loads with hooks builds a new one per call: a sixth of the
# JSONL parse's time).
_DECODER = json.JSONDecoder(parse_float=Decimal, parse_constant=_no_constant)


def _parquet(data: bytes, max_rows: int, max_decoded: int) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    decoded = 0
    over = (
        f"the batch decodes to more than {max_decoded} bytes (the platform's "
        "TRACE_SINK_MAX_BATCH_BYTES)"
    )
    try:
        f = pq.ParquetFile(io.BytesIO(data))
        if f.metadata.num_rows > max_rows:
            raise BatchRefused(
                f"the batch has {f.metadata.num_rows} rows; the dataset's max_rows is {max_rows}"
            )
        # Its footer and page headers first: nothing of it is decoded if they say too much.
        try:
            how = parquet.plan(data, f.metadata, f.schema, max_decoded)
        except parquet.Refused as e:
            raise BatchRefused(str(e)) from None
        f = pq.ParquetFile(
            io.BytesIO(data), metadata=f.metadata, read_dictionary=how.dictionary_paths
        )  # its footer as parsed above
        for part in f.iter_batches(batch_size=how.batch_rows):
            # As its rows will be once expanded (a dictionary's values repeated included).
            decoded += sum(parquet.dense_bytes(col) for col in part.columns)
            if decoded > max_decoded:
                raise BatchRefused(over)
            if len(rows) + part.num_rows > max_rows:
                raise BatchRefused(
                    f"the batch has more than {max_rows} rows; the dataset's max_rows is {max_rows}"
                )
            # Within the bound: its dictionaries expanded (their values read faster so).
            columns = [
                c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in part.columns
            ]
            rows.extend(pa.RecordBatch.from_arrays(columns, names=part.schema.names).to_pylist())
    except (pa.ArrowException, OSError) as e:
        raise BatchRefused(f"the batch is not a Parquet file: {e}") from None
    return rows


# A unique_key's values are one entry of a btree index, which Postgres caps near 2704 bytes:
# a longer key is refused with its row named (not by the index, mid-load).
MAX_KEY_BYTES = 2000


def check(
    rows: list[dict[str, Any]], columns: list[dict[str, Any]], key: list[str] | None = None
) -> tuple[list[str], list[list[Any]]]:
    """The rows as the table takes them: the declared columns' names and each row's values
    in that order, every value of its declared type. Any row that does not fit refuses the
    whole batch, naming the row and column."""
    names, rows_checked = checking(rows, columns, key)
    return names, list(rows_checked)


def checking(
    rows: list[dict[str, Any]], columns: list[dict[str, Any]], key: list[str] | None = None
) -> tuple[list[str], Iterator[list[Any]]]:
    """`check`, each row checked as it is taken: a sink streams the rows into its COPY while
    it checks the next ones (Postgres writes while Python checks), and a row that does not
    fit raises BatchRefused there, rolling back what its load had sent."""
    names = [c["name"] for c in columns]
    keyed = [i for i, name in enumerate(names) if name in (key or [])]
    return names, _checked(rows, columns, keyed)


def _checked(
    rows: list[dict[str, Any]], columns: list[dict[str, Any]], keyed: list[int]
) -> Iterator[list[Any]]:
    cols = [(c["name"], c.get("required", True), c["type"]) for c in columns]
    allowed = {c["name"] for c in columns} | BUFFER_RESERVED
    for n, row in enumerate(rows, start=1):
        if row.keys() - allowed:
            unknown = sorted(row.keys() - allowed)
            raise BatchRefused(f"row {n}: undeclared column(s) {', '.join(unknown)[:200]}")
        values = []
        for name, required, kind in cols:
            v = row.get(name)
            if v is None:
                if required:
                    raise BatchRefused(f"row {n}: required column '{name}' is missing or null")
                values.append(None)
                continue
            try:
                values.append(_value(kind, v))
            except (TypeError, ValueError, ArithmeticError, RecursionError) as e:
                raise BatchRefused(f"row {n}, column '{name}' ({kind}): {e}") from None
        size = _oversized_key(values, keyed)
        if size is not None:
            key_names = ", ".join(cols[i][0] for i in keyed)
            raise BatchRefused(
                f"row {n}: its unique_key ({key_names}) is {size} bytes; a key is at most "
                f"{MAX_KEY_BYTES}"
            )
        yield values


def _oversized_key(values: list[Any], keyed: list[int]) -> int | None:
    """The key's size in UTF-8 bytes when over MAX_KEY_BYTES, else None (encoded only when its
    character count says it could be: a character is at most 4 bytes)."""
    shown = [str(getattr(values[i], "obj", values[i])) for i in keyed]
    if sum(map(len, shown)) * 4 <= MAX_KEY_BYTES:
        return None
    size = sum(len(t.encode()) for t in shown)
    return size if size > MAX_KEY_BYTES else None


def _value(kind: str, v: Any) -> Any:
    if kind == "text":
        if not isinstance(v, str):
            raise TypeError(f"expected a string, got {type(v).__name__}")
        return _text(v)
    if kind == "int64":
        i = _integer(v)
        if not _INT64[0] <= i <= _INT64[1]:
            raise ValueError(f"{i} is outside int64")
        return i
    if kind == "uint256":
        i = _amount(v)
        if not 0 <= i <= _UINT256_MAX:
            raise ValueError("outside uint256 (0 .. 2^256-1)")
        return i
    if kind == "float64":
        if isinstance(v, bool) or not isinstance(v, int | float | Decimal):
            raise TypeError(f"expected a number, got {type(v).__name__}")
        f = float(v)
        if not math.isfinite(f):
            raise ValueError("not a finite number")
        return f
    if kind == "bool":
        if not isinstance(v, bool):
            raise TypeError(f"expected true or false, got {type(v).__name__}")
        return v
    if kind == "timestamp":
        return _timestamp(v)
    return Jsonb(_json(v))  # json: any JSON value


def _text(v: str) -> str:
    """Text Postgres stores: no NUL, and Unicode (JSON's \\ud800 escapes decode to lone
    surrogates, which no UTF-8 holds)."""
    if "\x00" in v:
        raise ValueError("text holds a NUL character")
    if v.isascii():  # no surrogate: nothing to encode
        return v
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"text holds a lone surrogate ({ascii(v[e.start])[1:-1]})") from None
    return v


def _json(v: Any) -> Any:
    """A JSON value jsonb stores: fractions as floats (finite), text as `_text`, and nothing
    JSON cannot say (a Parquet batch's timestamps or bytes)."""
    if v is None or isinstance(v, bool | int):
        return v
    if isinstance(v, str):
        return _text(v)
    if isinstance(v, Decimal | float):
        if isinstance(v, Decimal) and v == v.to_integral_value() and abs(v.adjusted()) < 4300:
            return int(v)
        f = float(v)
        if not math.isfinite(f):
            raise ValueError("not a finite number")
        return f
    if isinstance(v, dict):
        out = {}
        for k, item in v.items():
            if not isinstance(k, str):
                raise TypeError(f"an object key is a {type(k).__name__}, not a string")
            out[_text(k)] = _json(item)
        return out
    if isinstance(v, list | tuple):
        return [_json(item) for item in v]
    raise TypeError(f"a {type(v).__name__} is not a JSON value")


def _integer(v: Any) -> int:
    """An exact integer: a JSON integer, or one written as decimal text (never a float: it may
    have lost digits already)."""
    if isinstance(v, bool):
        raise TypeError("expected an integer, got a boolean")
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.lstrip("-").isdigit() and len(v) <= 80:
        return int(v)
    if isinstance(v, Decimal) and v == v.to_integral_value() and "e" not in str(v).lower():
        return int(v)
    raise TypeError(f"expected an integer (or its decimal text), got {_shown(v)}")


def _amount(v: Any) -> int:
    """An exact amount: an integer, its decimal text, or the limbs struct Trace stores
    amounts in on disk (spark/u256.py: l8 .. l0, base 10^9)."""
    if isinstance(v, dict) and sorted(v) == sorted(_LIMBS):
        total = 0
        for k, name in enumerate(reversed(_LIMBS)):
            limb = _integer(v[name])
            if not 0 <= limb < 10**9:
                raise ValueError(f"limb {name} is {limb}, outside 0 .. 10^9-1")
            total += limb * 10 ** (9 * k)
        return total
    try:
        return _integer(v)
    except TypeError:
        raise TypeError(
            f"expected an exact amount (integer or decimal text), got {_shown(v)}"
        ) from None


def _timestamp(v: Any) -> datetime:
    if isinstance(v, datetime):
        return v if v.tzinfo else v.replace(tzinfo=UTC)
    if isinstance(v, int) and not isinstance(v, bool):
        return datetime.fromtimestamp(v, UTC)  # seconds since the epoch (a block's time)
    if isinstance(v, str):
        try:
            t = datetime.fromisoformat(v)
        except ValueError:
            raise ValueError(f"{_shown(v)} is not an ISO 8601 time") from None
        return t if t.tzinfo else t.replace(tzinfo=UTC)
    raise TypeError(f"expected an ISO 8601 time or epoch seconds, got {_shown(v)}")


def _shown(v: Any) -> str:
    text = repr(v) if not isinstance(v, Decimal) else str(v)
    return text if len(text) <= 60 else text[:59] + "…"
