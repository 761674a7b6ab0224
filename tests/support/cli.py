"""The `trace` command line, run as a real subprocess (as a user would)."""

from __future__ import annotations

import os
import subprocess
import sys

TRACE = [sys.executable, "-m", "trace_platform.cli.main"]


def trace(
    args: list[str], env: dict[str, str], stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`trace *args` with the test's environment on top of this one, a wide terminal (tables
    are not wrapped) and `stdin` as its input."""
    return subprocess.run(
        [*TRACE, *args],
        env={**os.environ, "COLUMNS": "200", **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
