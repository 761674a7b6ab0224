"""How `pytest -n N --dist loadgroup` (the name chooses this scheduler) hands tests to its workers (tests/conftest.py installs it).

The suite's wall time is set by its few long end-to-end tests, so they must start first and
never wait behind one another on a busy worker while another worker idles:

- Units: a module whose tests share a module-scoped fixture (a devnet, a synced chain) is one
  unit, so the fixture is made once and not once per worker; every other test is its own unit.
- Longest first, from the durations a full run recorded (tests/durations.json; unknown tests
  get a small default, so a stale file only costs ordering, never correctness).
- A worker runs a test only once it holds the next one (xdist's worker needs its next item for
  fixture teardown), so the unit queued behind a long one is the cheapest left: a long unit is
  handed out only to a worker about to be free.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).resolve().parent.parent
DURATIONS = TESTS / "durations.json"
# A unit left on a worker costing more than this counts as long: what is queued behind it is
# the cheapest unit, not the next long one.
LONG_SECONDS = 5.0


# Modules whose tests share state across modules (an xdist_group mark naming the group): one
# unit, run in collection order. tests/conftest.py checks every xdist_group mark is listed here.
SHARED_GROUPS = {
    # The golden path's demo run is the cluster test's local side (tests/support/demo_rows.py).
    "tests/chaos/test_monad_demo.py": "demo_seed3",
    "tests/chaos/test_spark_cluster.py": "demo_seed3",
}


def grouped_modules(root: Path = TESTS) -> frozenset[str]:
    """Test modules that make a module-scoped fixture (`scope="module"`, or a devnet from
    `devnet_fixture`), as paths from the repository root. Read from the source because the
    controller collects nothing (and xdist's own xdist_group suffix no longer reaches it under
    pytest 9); tests/conftest.py checks at collection that pytest agrees."""
    found = set()
    for path in root.rglob("test_*.py"):
        text = path.read_text()
        if 'scope="module"' in text or "devnet_fixture(" in text:
            found.add(path.relative_to(root.parent).as_posix())
    return frozenset(found)


def default_cost(nodeid: str) -> float:
    return 10.0 if nodeid.startswith("tests/chaos/") else 0.5


def load_costs(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


class LongestFirst(LoadScopeScheduling):
    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self.costs = load_costs()
        self.ordered = False
        self.grouped = grouped_modules()

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        if module in SHARED_GROUPS:
            return SHARED_GROUPS[module]
        return module if module in self.grouped else nodeid

    def cost(self, nodeid: str) -> float:
        return self.costs.get(nodeid, default_cost(nodeid))

    def unit_cost(self, unit: dict[str, bool]) -> float:
        return sum(self.cost(n) for n, done in unit.items() if not done)

    def _assign_work_unit(self, node: Any) -> None:
        if not self.ordered:  # the queue is complete on the first assignment
            units = sorted(self.workqueue.items(), key=lambda u: -self.unit_cost(u[1]))
            self.workqueue = OrderedDict(units)
            self.ordered = True
        left = sum(self.unit_cost(u) for u in self.assigned_work.get(node, {}).values())
        if left > LONG_SECONDS:  # busy for a while: queue the cheapest unit behind it
            self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)
        super()._assign_work_unit(node)  # takes the queue's first unit

    def _reschedule(self, node: Any) -> None:
        # One unit queued beyond the running one (xdist's default keeps up to three), so a
        # long unit is never committed to a worker that has long work still ahead of it.
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 1:
            return
        self._assign_work_unit(node)


class DurationRecorder:
    """With TRACE_TEST_DURATIONS_OUT set, writes each test's setup+call+teardown seconds there
    at the end of the run (the controller sees every worker's reports): how
    tests/durations.json is refreshed. A test that failed or was skipped keeps the time the
    file had for it: a long test that failed fast (or never ran) would otherwise be scheduled
    as a short one, late, and stretch the next runs' wall time."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.seconds: dict[str, float] = {}
        self.unsound: set[str] = set()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        key = report.nodeid
        self.seconds[key] = self.seconds.get(key, 0.0) + report.duration
        if report.failed or report.skipped:
            self.unsound.add(key)

    @pytest.hookimpl
    def pytest_sessionfinish(self) -> None:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            return  # only the controller holds every worker's reports
        before = load_costs(self.out)
        seconds = {
            k: before[k] if k in self.unsound and k in before else v
            for k, v in self.seconds.items()
        }
        rounded = {k: round(v, 2) for k, v in sorted(seconds.items())}
        self.out.write_text(json.dumps(rounded, indent=0) + "\n")
