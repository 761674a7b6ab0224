"""`trace verify`'s block sampling: the range's ends always, the rest spread and seeded."""

from __future__ import annotations

import pytest

from trace_platform.verify import sample_blocks
from trace_platform.verify.sampling import sample_of


def test_samples_hold_both_ends_and_one_pick_per_slice() -> None:
    for seed in range(50):
        got = sample_blocks(100, 1099, 8, seed)
        assert len(got) == 8 and got == sorted(set(got))
        assert got[0] == 100 and got[-1] == 1099
        # Six slices of the 998 blocks between the ends, one pick in each.
        for i, b in enumerate(got[1:-1]):
            assert 101 + i * 998 // 6 <= b <= 100 + (i + 1) * 998 // 6
    assert sample_blocks(0, 299, 8, 4) == sample_blocks(0, 299, 8, 4)
    assert len({tuple(sample_blocks(0, 299, 8, s)) for s in range(20)}) > 1


def test_small_ranges_and_bad_counts() -> None:
    assert sample_blocks(5, 9, 8, 1) == [5, 6, 7, 8, 9]
    assert sample_blocks(5, 13, 8, 1)[0::7] == [5, 13]
    assert sample_blocks(7, 7, 2, 0) == [7]
    assert sample_blocks(9, 7, 2, 0) == []
    assert sample_of([49, 99, 149, 199, 249, 299], 3, 2)[0::2] == [49, 299]
    with pytest.raises(ValueError, match="at least 2"):
        sample_blocks(0, 10, 1, 0)
