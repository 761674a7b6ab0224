"""The benches' smoke size, one way for all of them.

`--smoke` (or TRACE_BENCH_SMOKE=1 in the environment) runs a bench at a size at which it takes
seconds: the same code paths, the same checks of its own work (its own tasks and rows counted,
the two sides' results compared), and the same refusal (a non-zero exit) when one fails. A smoke
run prints no figure that could be quoted: the bench's standard output is swallowed, and only
`smoke: <bench>: checks passed` is printed, once the bench has returned without an error.
tests/integration/test_benches_smoke.py runs every bench this way.

A bench uses it in two places:

    args = smoke.parse_args(ap, tasks=20, repeat=1)  # the smoke sizes: defaults under --smoke
    ...
    if __name__ == "__main__":
        smoke.main(main)

Full-size runs are unchanged: `make bench` (bench/run_all.py) runs every bench at full size and
writes their figures to bench/results.md.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "TRACE_BENCH_SMOKE"
FLAG = "--smoke"
# Seconds after which a smoke run writes every thread's stack to standard error (the test's
# timeout comes after it: a hung bench then says where it hung).
STACKS_AFTER = "TRACE_BENCH_SMOKE_STACKS_AFTER"

_active = False
_real_stdout_fd: int | None = None  # the process's standard output, set aside at smoke size


def requested(argv: list[str] | None = None) -> bool:
    """Whether this run is at smoke size: `--smoke` on the command line, or TRACE_BENCH_SMOKE
    set to anything but empty or 0."""
    argv = sys.argv[1:] if argv is None else argv
    return FLAG in argv or os.environ.get(ENV, "") not in ("", "0")


def parse_args(
    ap: argparse.ArgumentParser, argv: list[str] | None = None, **sizes: Any
) -> argparse.Namespace:
    """Parse the bench's arguments; at smoke size `sizes` replace the defaults (an option given
    on the command line still wins), `args.smoke` is True, and standard output is swallowed
    from here on."""
    global _active
    ap.add_argument(
        FLAG,
        action="store_true",
        help=f"smoke size: seconds, every check, no figures (or {ENV}=1)",
    )
    argv = sys.argv[1:] if argv is None else argv
    smoke = requested(argv)
    if smoke:
        unknown = [k for k in sizes if not any(a.dest == k for a in ap._actions)]
        if unknown:
            raise ValueError(f"smoke sizes for options the bench does not have: {unknown}")
        ap.set_defaults(**sizes)
    args = ap.parse_args(argv)
    args.smoke = smoke
    if smoke and not _active:
        _active = True
        # Small data: Spark's JVMs on the quick compiler profile, as the test suite runs them.
        os.environ.setdefault("TRACE_SPARK_JIT", "quick")
        if after := os.environ.get(STACKS_AFTER):
            faulthandler.dump_traceback_later(float(after))
        _swallow_stdout()
    return args


def durable() -> bool:
    """Whether a bench's own Postgres runs with fsync on: at full size, yes (real commit costs
    are what its figures are of); at smoke size no figure is printed, and fsync on a busy
    machine's disk (initdb, the migrations, every commit) was most of a smoke run's time."""
    return not _active


def _swallow_stdout() -> None:
    """Figures go nowhere: standard output (file descriptor 1, so also what native code such as
    Cryo's report and the bench's child processes write there) is pointed at /dev/null; errors
    and the checks' refusals still reach standard error."""
    global _real_stdout_fd
    sys.stdout.flush()
    _real_stdout_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def main(entry: Callable[[], int | None], name: str | None = None) -> None:
    """Run a bench's main(); exit with its failure (an exception's traceback, a SystemExit's
    message or a non-zero return) or, at smoke size, print that its checks passed."""
    rc = entry()
    if rc not in (None, 0):
        raise SystemExit(rc)
    if _active and _real_stdout_fd is not None:
        sys.stdout.flush()
        bench = name or Path(sys.argv[0]).stem
        os.write(_real_stdout_fd, f"smoke: {bench}: checks passed\n".encode())
