"""The machine a bench ran on, as the benches describe it (bench/run_all.py's results file,
queue_bench's report): cores and CPU model, memory, OS, Python; and the load average."""

from __future__ import annotations

import contextlib
import os
import platform


def describe() -> list[tuple[str, str]]:
    """(what, value) rows: cores (and the CPU model), memory, OS, Python."""
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        mem = f"{int(f.readline().split()[1]) / 1024 / 1024:.1f} GiB"
    return [
        ("cores", f"{os.cpu_count()} ({cpu})"),
        ("memory", mem),
        ("os", platform.platform()),
        ("python", platform.python_version()),
    ]


def loadavg() -> str:
    """The 1, 5 and 15-minute load averages (other work on the machine skews the figures)."""
    with contextlib.suppress(OSError), open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])
    return "?"
