"""range_aggregator's window arithmetic: every window emitted once, whatever the order."""

from __future__ import annotations

import random

from trace_platform.operators.ranges import (
    completed_windows,
    invalidated_windows,
    merge,
    reorged,
    split,
)


def test_merge_joins_touching_and_overlapping_ranges() -> None:
    assert merge([(10, 20), (0, 10), (30, 40), (15, 25)]) == [(0, 25), (30, 40)]


def test_each_window_is_emitted_exactly_once_in_any_order_with_duplicates() -> None:
    ranges = split(0, 2999, 250)  # 12 ranges, three windows of 1000
    for seed in range(20):
        shuffled = ranges + random.Random(seed).sample(ranges, 5)  # plus redeliveries
        random.Random(seed).shuffle(shuffled)
        covered: list[tuple[int, int]] = []
        emitted: list[tuple[int, int]] = []
        for r in shuffled:
            covered, done = completed_windows(covered, r, 1000, 0)
            emitted += done
        assert sorted(emitted) == [(0, 1000), (1000, 2000), (2000, 3000)]
        assert covered == [(0, 3000)]


def test_windows_follow_the_origin_and_ignore_blocks_before_it() -> None:
    covered, done = completed_windows([], (500, 1500), 1000, 500)
    assert done == [(500, 1500)]
    _, done = completed_windows(covered, (0, 500), 1000, 500)
    assert done == []
    # A range spanning several windows completes all of them at once.
    _, done = completed_windows([], (0, 3000), 1000, 0)
    assert done == [(0, 1000), (1000, 2000), (2000, 3000)]


def test_a_rewritten_range_reopens_exactly_the_complete_windows_it_overlaps() -> None:
    covered = [(0, 300), (400, 450)]  # windows of 100: [0,100) [100,200) [200,300) complete
    assert invalidated_windows(covered, (150, 250), 100, 0) == [(100, 200), (200, 300)]
    assert invalidated_windows(covered, (100, 200), 100, 0) == [(100, 200)]
    # A window not complete yet is not reopened: its first manifest is still to come.
    assert invalidated_windows(covered, (420, 430), 100, 0) == []
    assert invalidated_windows(covered, (250, 420), 100, 0) == [(200, 300)]
    assert invalidated_windows(covered, (5, 5), 100, 0) == []
    assert invalidated_windows([(50, 250)], (60, 70), 100, 50) == [(50, 150)]


def test_a_reorg_reemits_every_recorded_range_from_the_first_the_node_disowns() -> None:
    recent = [(0, 100, "0xa"), (100, 200, "0xb"), (200, 300, "0xc")]
    assert reorged(recent, ["0xa", "0xb", "0xc"]) == []
    assert reorged(recent, ["0xa", "0xB2", "0xc"]) == [(100, 200), (200, 300)]
    assert reorged(recent, ["0xa", "0xb", None]) == [(200, 300)]  # the chain got shorter
    assert reorged([], []) == []
