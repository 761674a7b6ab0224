"""Every bench under bench/ runs at smoke size (`--smoke`: bench/smoke.py), as a subprocess with
this interpreter, so a bench that crashes, or whose own checks fail (it counts its own tasks and
rows and compares the two sides' results), breaks the suite instead of rotting until someone runs
`make bench`. A smoke run prints no figure: only its `smoke: <bench>: checks passed` line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# Every bench (bench/*_bench.py); the shared helpers are not benches.
BENCHES = sorted(p.stem for p in BENCH.glob("*_bench.py"))
TIMEOUT_S = 600  # a bench's smoke run takes seconds; a hung one fails here, not at the suite's


def test_every_bench_is_covered() -> None:
    assert len(BENCHES) >= 12, BENCHES
    assert (
        not {p.stem for p in BENCH.glob("*.py")}
        - set(BENCHES)
        - {
            "smoke",
            "embedded_pg",
            "run_all",
        }
    ), "a new file in bench/ is neither a bench (*_bench.py) nor a known helper"


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_smoke(bench: str) -> None:
    env = {**os.environ, "TRACE_BENCH_SMOKE": "1", "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{bench}.py"), "--smoke"],
        cwd=BENCH.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    out = proc.stdout.splitlines()
    assert proc.returncode == 0, (
        f"{bench} --smoke exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-6000:]}"
    )
    assert f"smoke: {bench}: checks passed" in out, proc.stdout[-3000:]
    # No figure to quote: the bench's own output is swallowed at smoke size.
    assert [line for line in out if line.startswith("smoke:")] == out, proc.stdout[-3000:]
