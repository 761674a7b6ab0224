"""Which blocks to check: spread over the synced range, its first and last block always."""

from __future__ import annotations

import random


def sample_blocks(lo: int, hi: int, n: int, seed: int) -> list[int]:
    """`n` blocks of [lo, hi], sorted: lo, hi, and one seeded pick from each of n-2 equal slices
    of the blocks between them (so the picks spread over the range instead of clustering)."""
    if n < 2:
        raise ValueError("at least 2 samples: the range's first and last block")
    if hi < lo:
        return []
    if hi - lo + 1 <= n:
        return list(range(lo, hi + 1))
    rng = random.Random(seed)
    inner, slices = hi - lo - 1, n - 2
    picks = [
        rng.randint(lo + 1 + i * inner // slices, lo + (i + 1) * inner // slices)
        for i in range(slices)
    ]
    return [lo, *picks, hi]


def sample_of(items: list[int], n: int, seed: int) -> list[int]:
    """The same spread over a sorted list (the window ends): its first and last always."""
    return [items[i] for i in sample_blocks(0, len(items) - 1, n, seed)]
