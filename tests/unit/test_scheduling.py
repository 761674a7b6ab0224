"""The suite's scheduler (tests/support/scheduling.py): longest units first, a cheap unit queued
behind a long one, a module with a module-scoped fixture as one unit."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support import scheduling
from tests.support.scheduling import LongestFirst, grouped_modules


class Node:
    """xdist's WorkerController as the scheduler uses it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


GROUPED = "tests/integration/test_shared.py"
COSTS = {
    "tests/chaos/test_a.py::test_long": 300.0,
    "tests/chaos/test_b.py::test_long": 200.0,
    "tests/chaos/test_c.py::test_long": 100.0,
    f"{GROUPED}::test_one": 40.0,
    f"{GROUPED}::test_two": 40.0,
}
CHEAP = [f"tests/unit/test_u.py::test_{i}" for i in range(6)]


def scheduler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Any, list[Node]]:
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps(COSTS))
    monkeypatch.setattr(scheduling, "DURATIONS", durations)
    monkeypatch.setattr(scheduling, "grouped_modules", lambda: frozenset({GROUPED}))
    config = SimpleNamespace(
        getvalue=lambda name: ["2*popen"] if name == "tx" else None,
        option=SimpleNamespace(loadscopereorder=True),
    )
    sched = LongestFirst(config)  # type: ignore[arg-type]
    collection = [*CHEAP, *COSTS]  # the long ones last, as collected
    nodes = [Node("gw0"), Node("gw1")]
    for n in nodes:
        sched.add_node(n)
        sched.add_node_collection(n, collection)
    sched.schedule()
    return sched, nodes


def ids(sched: Any, node: Node) -> list[str]:
    return [sched.collection[i] for i in node.sent]


def test_long_units_start_first_each_with_a_cheap_one_queued_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sched, (gw0, gw1) = scheduler(monkeypatch, tmp_path)
    assert ids(sched, gw0)[0] == "tests/chaos/test_a.py::test_long"
    assert ids(sched, gw1)[0] == "tests/chaos/test_b.py::test_long"
    # Queued behind each long test: a cheap one, not the next long one.
    assert all(i.startswith("tests/unit/") for i in (ids(sched, gw0)[1], ids(sched, gw1)[1]))
    # gw1 ends its long test first: what it is handed next (its queued cheap test about to
    # run) is the longest unit left.
    sched.mark_test_complete(gw1, gw1.sent[0])
    assert ids(sched, gw1)[2] == "tests/chaos/test_c.py::test_long"


def test_a_module_with_a_module_fixture_is_one_unit_on_one_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sched, nodes = scheduler(monkeypatch, tmp_path)
    completed: set[tuple[str, int]] = set()
    while sched.workqueue or any((n.name, i) not in completed for n in nodes for i in n.sent):
        for n in nodes:  # each node finishes what it was sent, in order
            for i in list(n.sent):
                if (n.name, i) not in completed:
                    completed.add((n.name, i))
                    sched.mark_test_complete(n, i)
    holders = [n.name for n in nodes if any(GROUPED in t for t in ids(sched, n))]
    assert len(holders) == 1
    every = sorted(t for n in nodes for t in ids(sched, n))
    assert every == sorted([*CHEAP, *COSTS])  # each test sent once


def test_the_suites_module_fixtures_are_all_seen() -> None:
    found = grouped_modules()
    assert "tests/chaos/test_monad_demo.py" in found  # a devnet
    assert "tests/integration/test_exact_amounts.py" in found  # its own module fixtures
    assert "tests/unit/test_scheduling.py" not in found


def test_modules_of_one_shared_group_are_one_unit_in_collection_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(
        scheduling,
        "SHARED_GROUPS",
        {"tests/chaos/test_a.py": "g", "tests/chaos/test_b.py": "g"},
    )
    sched, nodes = scheduler(monkeypatch, tmp_path)
    holder = [n for n in nodes if "tests/chaos/test_a.py::test_long" in ids(sched, n)]
    assert len(holder) == 1
    sent = ids(sched, holder[0])
    assert sent.index("tests/chaos/test_a.py::test_long") + 1 == sent.index(
        "tests/chaos/test_b.py::test_long"
    )


def test_a_failed_or_skipped_test_keeps_its_recorded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long test that failed at once (or was skipped) is not recorded as short: the next
    runs would hand it out last and wait for it at the end."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    out = tmp_path / "durations.json"
    out.write_text(json.dumps({"t::long_failed": 300.0, "t::long_skipped": 200.0, "t::ok": 9.0}))
    recorder = scheduling.DurationRecorder(str(out))
    for nodeid, seconds, outcome in [
        ("t::long_failed", 0.5, "passed"),  # setup
        ("t::long_failed", 4.0, "failed"),  # call
        ("t::long_skipped", 0.0, "skipped"),
        ("t::ok", 1.0, "passed"),
        ("t::new_failed", 2.0, "failed"),  # nothing to keep: its own time
    ]:
        report = SimpleNamespace(
            nodeid=nodeid,
            duration=seconds,
            failed=outcome == "failed",
            skipped=outcome == "skipped",
        )
        recorder.pytest_runtest_logreport(report)  # type: ignore[arg-type]
    recorder.pytest_sessionfinish()
    assert json.loads(out.read_text()) == {
        "t::long_failed": 300.0,
        "t::long_skipped": 200.0,
        "t::new_failed": 2.0,
        "t::ok": 1.0,
    }
