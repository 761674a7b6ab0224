"""The sink's row checks (sink/batch.check) at their edges, after their fast paths: a key's
size counted exactly once its characters could pass the index bound, text checked for NUL
and lone surrogates whether ASCII or not, undeclared columns named (the reserved ones the
sink writes itself are ignored), a JSONL line decoded with the one shared decoder."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from trace_platform.sink.batch import MAX_KEY_BYTES, BatchRefused, check, parse

COLUMNS = [
    {"name": "k", "type": "text"},
    {"name": "note", "type": "text", "required": False},
    {"name": "n", "type": "int64", "required": False},
]
WIDE = "\U0001f600"  # four bytes in UTF-8


def _check(rows: list[dict[str, Any]]) -> list[list[Any]]:
    return check(rows, COLUMNS, ["k"])[1]


def test_a_key_of_wide_characters_is_measured_in_bytes() -> None:
    at_bound = WIDE * (MAX_KEY_BYTES // 4)
    assert _check([{"k": at_bound}]) == [[at_bound, None, None]]
    with pytest.raises(BatchRefused, match=f"is {MAX_KEY_BYTES + 4} bytes"):
        _check([{"k": at_bound + WIDE}])
    ascii_long = "a" * (MAX_KEY_BYTES + 1)  # one byte a character: over by one
    with pytest.raises(BatchRefused, match=f"is {MAX_KEY_BYTES + 1} bytes"):
        _check([{"k": ascii_long}])


@pytest.mark.parametrize(
    "text, why",
    [("a\x00b", "NUL"), ("é\x00", "NUL"), ("é\ud800", "lone surrogate"), ("\udc00", "surrogate")],
)
def test_text_postgres_cannot_store_is_refused_ascii_or_not(text: str, why: str) -> None:
    with pytest.raises(BatchRefused, match=why):
        _check([{"k": "a", "note": text}])


def test_text_beyond_ascii_passes() -> None:
    assert _check([{"k": "ключ", "note": WIDE}]) == [["ключ", WIDE, None]]


def test_undeclared_columns_are_named_and_reserved_ones_ignored() -> None:
    assert _check([{"k": "a", "org_id": "x", "record_id": "y"}]) == [["a", None, None]]
    with pytest.raises(BatchRefused, match=r"row 2: undeclared column\(s\) a_extra, z_extra"):
        _check([{"k": "a"}, {"k": "b", "z_extra": 1, "a_extra": 2}])


def test_jsonl_lines_keep_exact_numbers_and_refuse_non_json_constants() -> None:
    rows = parse(b'{"k": "a", "x": 1.10}\n\n{"k": "b"}\n', "application/jsonl", 10, 1 << 20)
    assert rows == [{"k": "a", "x": Decimal("1.10")}, {"k": "b"}]
    with pytest.raises(BatchRefused, match="line 2 is not JSON"):
        parse(b'{"k": "a"}\n{"k": NaN}\n', "application/jsonl", 10, 1 << 20)
