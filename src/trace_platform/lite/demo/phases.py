"""The demo's own phase timings: where its wall time went, printed at the end (so a slow
demo says which part was slow)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table


class Phases:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.rows: list[tuple[str, float, str]] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.rows.append((name, time.monotonic() - start, ""))

    def stages(self, tasks: list[dict[str, Any]], stage_of: dict[str, str]) -> None:
        """Within the last phase: each stage's span (its first task's start to its last task's
        finish), as the run's tasks recorded them."""
        spans: dict[str, list[datetime]] = {}
        counts: dict[str, int] = {}
        for t in tasks:
            stage = stage_of.get(t["job"])
            if stage is None or t["started_at"] is None or t["finished_at"] is None:
                continue
            span = spans.setdefault(stage, [t["started_at"], t["finished_at"]])
            span[0], span[1] = min(span[0], t["started_at"]), max(span[1], t["finished_at"])
            counts[stage] = counts.get(stage, 0) + 1
        for stage, (first, last) in sorted(spans.items(), key=lambda s: s[1][0]):
            n = counts[stage]
            self.rows.append(
                (f"  {stage}", (last - first).total_seconds(), f"{n} task{'s' * (n != 1)}")
            )

    def report(self, console: Console) -> None:
        table = Table(title="Where the time went", title_justify="left")
        table.add_column("phase")
        table.add_column("seconds", justify="right")
        table.add_column("")
        for name, seconds, note in self.rows:
            table.add_row(name, f"{seconds:.1f}", note)
        table.add_row("total", f"{time.monotonic() - self.t0:.1f}", "")
        console.print(table)
