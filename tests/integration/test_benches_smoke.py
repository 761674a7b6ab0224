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
# Benches whose smallest run is minutes, not seconds: `make bench` runs them at full size, and
# `--smoke` runs them by hand. Each says why.
FULL_ONLY = {
    "profile_bench": "two Lite stacks (lite and aws profiles) each running the demo DAG with "
    "a dozen Spark jobs: over 60 s even on a 200-block chain",
}
# Every bench (bench/*_bench.py) but those; the shared helpers are not benches.
BENCHES = sorted(p.stem for p in BENCH.glob("*_bench.py") if p.stem not in FULL_ONLY)
TIMEOUT_S = 600  # a bench's smoke run takes seconds; a hung one fails here, not at the suite's


def test_every_bench_is_covered() -> None:
    assert len(BENCHES) >= 12, BENCHES
    # A full-size-only bench is still one: a file, and in `make bench`'s list.
    listed = (BENCH / "run_all.py").read_text()
    assert all((BENCH / f"{b}.py").exists() and f'("{b}", ' in listed for b in FULL_ONLY)
    assert (
        not {p.stem for p in BENCH.glob("*.py")}
        - set(BENCHES)
        - set(FULL_ONLY)
        - {
            "smoke",
            "embedded_pg",
            "machine",
            "moto_server",
            "run_all",
        }
    ), "a new file in bench/ is neither a bench (*_bench.py) nor a known helper"


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_smoke(bench: str) -> None:
    if bench == "sandbox_bench" and os.geteuid() != 0:
        pytest.skip("sandbox_bench's sandboxed rows switch users: root only")
    env = {
        **os.environ,
        "TRACE_BENCH_SMOKE": "1",
        "SPARK_LOCAL_IP": "127.0.0.1",
        # A hung bench writes its threads' stacks before the timeout kills it.
        "TRACE_BENCH_SMOKE_STACKS_AFTER": str(TIMEOUT_S - 30),
    }
    try:
        proc = subprocess.run(
            [sys.executable, str(BENCH / f"{bench}.py"), "--smoke"],
            cwd=BENCH.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        pytest.fail(f"{bench} --smoke hung for {TIMEOUT_S} s\n--- stderr\n{(err or '')[-8000:]}")
    out = proc.stdout.splitlines()
    assert proc.returncode == 0, (
        f"{bench} --smoke exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-6000:]}"
    )
    assert f"smoke: {bench}: checks passed" in out, proc.stdout[-3000:]
    # No figure to quote: the bench's own output is swallowed at smoke size.
    assert [line for line in out if line.startswith("smoke:")] == out, proc.stdout[-3000:]


FAKE = """
import argparse, sys
sys.path.insert(0, {bench!r})
import smoke

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--extra", type=int, default=0)
    args = smoke.parse_args(ap, tasks=3)
    done = args.tasks + args.extra  # the bench's own count of what it ran
    if done != args.tasks:
        raise SystemExit(f"refusing to print: {{done}} of {{args.tasks}} tasks")
    print(f"{{args.tasks}} tasks: 1234 tasks/s")

if __name__ == "__main__":
    smoke.main(main)
"""


@pytest.mark.parametrize("extra", [0, 1])
def test_smoke_size_keeps_the_checks_and_prints_no_figure(extra: int, tmp_path: Path) -> None:
    """The shared helper's contract, on a bench of three lines: smoke sizes replace the
    defaults, a figure is never printed, and a failed check (one task counted more) still exits
    non-zero with its refusal."""
    fake = tmp_path / "fake_bench.py"
    fake.write_text(FAKE.format(bench=str(BENCH)))
    env = {k: v for k, v in os.environ.items() if k != "TRACE_BENCH_SMOKE"}
    full = subprocess.run(
        [sys.executable, str(fake), "--extra", str(extra)], capture_output=True, text=True, env=env
    )
    smoke = subprocess.run(
        [sys.executable, str(fake), "--smoke", "--extra", str(extra)],
        capture_output=True,
        text=True,
        env=env,
    )
    if extra:
        assert full.returncode != 0 and "1001 of 1000" in full.stderr
        assert smoke.returncode != 0 and "4 of 3" in smoke.stderr
        assert smoke.stdout == "" and full.stdout == ""
    else:
        assert full.returncode == 0 and full.stdout == "1000 tasks: 1234 tasks/s\n"
        assert smoke.returncode == 0 and smoke.stdout == "smoke: fake_bench: checks passed\n"
