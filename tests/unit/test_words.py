"""The decode's Arrow batch kernels (trace_platform.spark.words) without Spark: limbs equal to
Python's integers for every uint256 (and their negations), hex text as Spark's
concat('0x', lower(hex(substring(...)))) gives it, NULLs kept. (On the real Spark, through the
decode operators: tests/integration/test_exact_amounts.py and bench/decode_bench.py.)"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.amounts import limbs
from trace_platform.spark import u256, words

EDGES = [0, 1, 10**9 - 1, 10**9, 2**64 - 1, 2**64, 10**38, 2**255, 2**256 - 1]


def test_limbs_are_u256s() -> None:
    assert (words.BASE, words.TOP, words.FIELDS) == (u256.BASE, u256.TOP, u256.FIELDS)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**256 - 1), max_size=40))
def test_word_limbs_and_negation_are_exact(values: list[int]) -> None:
    values = EDGES + values
    arr = pa.array([v.to_bytes(32, "big") for v in values] + [None])
    assert words.word_limbs(arr).to_pylist() == [limbs(v) for v in values] + [None]
    parts, valid = words.words_matrix(arr)
    negated = words.limbs_array(words.negate(words.limbs_of_words(parts)), valid)
    assert negated.to_pylist() == [limbs(-v) for v in values] + [None]


def test_a_word_that_is_not_32_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="not 32 bytes"):
        words.word_limbs(pa.array([b"\x01" * 32, b"\x01" * 31]))


def test_hex_text_is_sparks() -> None:
    values = [b"\x01\xab", None, b"", b"\xff" * 40, bytes(range(5))]
    arr = pa.array(values)

    def spark(v: bytes | None, start: int = 0, length: int | None = None) -> str | None:
        if v is None:
            return None
        return "0x" + v[start : None if length is None else start + length].hex()

    assert words.hex_text(arr).to_pylist() == [spark(v) for v in values]
    assert words.hex_text(arr, 12, 20).to_pylist() == [spark(v, 12, 20) for v in values]
    same = pa.array([bytes(range(i, i + 32)) for i in range(5)]).slice(1)  # an offset array
    assert words.hex_text(same).to_pylist() == [spark(v) for v in same.to_pylist()]
