"""Process trees, read from /proc (chaos tests signal what a process started)."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """Every descendant (the sandbox chain is setpriv/unshare -> PID 1 -> host -> JVM...; a
    postmaster's backends)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents[int(entry.name)] = ppid
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        out.extend(kids)
        frontier = kids
    return out


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
