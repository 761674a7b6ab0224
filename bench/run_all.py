"""`make bench`: every bench at full size, one at a time, and one results file.

Runs each bench below as a subprocess with this interpreter (never two at once: they measure
this machine), echoes its output as it comes, and writes bench/results.md: the machine and the
date, one table of every bench's outcome (its command, whether its checks passed, its wall
time), and under it each bench's own figures and ratios, verbatim (a bench prints nothing when
a check fails: the table then says so and quotes its error). The docs' benchmark page includes
that file.

    .venv/bin/python bench/run_all.py [--only queue_bench,u256_bench] [--out bench/results.md]

A pass with `--only` keeps, from the results file it replaces, the row and the figures of every
bench it did not run, its checks cell naming the earlier pass (date and commit) they are from.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from machine import describe, loadavg  # this folder's: run as a script

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
# (bench, its full-size arguments), in the order they run.
BENCHES: list[tuple[str, list[str]]] = [
    ("queue_bench", []),
    ("dispatch_bench", []),
    ("sync_bench", []),
    ("query_bench", []),
    ("query_fairness_bench", []),
    ("sandbox_bench", []),
    ("change_bench", ["--demo"]),
    ("commit_check_bench", []),
    ("fault_bench", []),
    ("host_bench", []),
    ("u256_bench", []),
    ("decode_bench", []),
    ("act_bench", []),
    ("retention_bench", []),
    ("tracking_bench", []),
    ("profile_bench", []),
]


def machine() -> list[tuple[str, str]]:
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return [*describe(), ("commit", commit or "?")]


def run(name: str, args: list[str]) -> tuple[int, float, str, str]:
    """(exit code, wall seconds, stdout, stderr's tail); stdout and stderr echoed as they come."""
    cmd = [sys.executable, str(BENCH / f"{name}.py"), *args]
    env = {**os.environ, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")}
    env.pop("TRACE_BENCH_SMOKE", None)  # full size
    print(f"\n=== {name} {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    err_lines: list[str] = []

    def pump_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            err_lines.append(line)
            del err_lines[:-40]

    t = threading.Thread(target=pump_err, daemon=True)
    t.start()
    out: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        out.append(line)
    rc = proc.wait()
    t.join(5)
    return rc, time.perf_counter() - t0, "".join(out), "".join(err_lines)


def earlier(path: Path) -> dict[str, tuple[str, list[str]]]:
    """From a results file: each bench's table row (its checks cell naming the pass it is from)
    and its section, for the benches that pass ran."""
    if not path.exists():
        return {}
    text = path.read_text()
    when = re.search(r" on (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", text)
    commit = re.search(r"^\| commit \| (\S+) \|$", text, re.MULTILINE)
    origin = f"{when[1] if when else '?'}, commit {commit[1] if commit else '?'}"
    out: dict[str, tuple[str, list[str]]] = {}
    for name, _ in BENCHES:
        row = re.search(rf"^\| \[{name}\]\(#{name}\) \|.*$", text, re.MULTILINE)
        section = re.search(rf"^## {name}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
        if row is None or section is None:
            continue
        cells = row[0].split(" | ")
        if "earlier pass" not in cells[2]:
            cells[2] += f" (earlier pass: {origin})"
        out[name] = (" | ".join(cells), [f"## {name}", *section[1].rstrip("\n").split("\n")])
    return out


def write(
    path: Path,
    info: list[tuple[str, str]],
    rows: list[dict[str, object]],
    kept: dict[str, tuple[str, list[str]]],
) -> None:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    ran = {r["name"] for r in rows}
    which = (
        "every bench"
        if len(ran) == len(BENCHES)
        else "the benches run in this pass (a bench not run is marked so, or keeps an earlier"
        " pass's row and figures, that pass named in its checks cell)"
    )
    lines = [
        "# Benchmark results",
        "",
        f"Written by `make bench` (bench/run_all.py) on {now}: {which} at full size, one at"
        " a time, on the machine below. Each bench checks its own work (its own tasks and rows"
        " counted, the two sides' results compared) and prints no figure when a check fails.",
        "",
        "| machine | |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in info),
        "",
        "| bench | command | checks | wall time | load average (before, after) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| [{r['name']}](#{r['name']}) | `{r['cmd']}` | {r['status']} | {r['wall']:.0f} s "
            f"| {r['load']} |"
        )
    for name, args in BENCHES:  # `--only`: the others are listed, not left out silently
        if name in kept and name not in ran:
            lines.append(kept[name][0])
        elif name not in ran:
            cmd = " ".join(["python", f"bench/{name}.py", *args])
            lines.append(f"| {name} | `{cmd}` | not run in this pass | - | - |")
    for r in rows:
        lines += ["", f"## {r['name']}", "", f"`{r['cmd']}`", "", "```text"]
        lines += [str(r["out"]).rstrip("\n") or "(no figures printed)", "```"]
        if r["rc"]:
            lines += ["", "Its error (stderr, last lines):", "", "```text"]
            lines += [str(r["err"]).rstrip("\n"), "```"]
    for name, (_, section) in kept.items():
        if name not in ran:
            lines += ["", *section]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated bench names (default: all)")
    ap.add_argument("--out", type=Path, default=BENCH / "results.md")
    args = ap.parse_args()
    only = {n for n in args.only.split(",") if n}
    unknown = only - {n for n, _ in BENCHES}
    if unknown:
        raise SystemExit(f"no such bench: {sorted(unknown)}")
    info = machine()
    kept = earlier(args.out) if only else {}  # a partial pass keeps the others' figures
    rows: list[dict[str, object]] = []
    for name, bench_args in BENCHES:
        if only and name not in only:
            continue
        before = loadavg()
        rc, wall, out, err = run(name, bench_args)
        rows.append(
            {
                "name": name,
                "cmd": " ".join(["python", f"bench/{name}.py", *bench_args]),
                "rc": rc,
                "status": "passed" if rc == 0 else f"**FAILED** (exit {rc}): no figures",
                "wall": wall,
                "load": f"{before}; {loadavg()}",
                "out": out if rc == 0 else "",
                "err": err,
            }
        )
        write(args.out, info, rows, kept)  # after every bench: a long run leaves what it measured
    print(f"\nresults: {args.out}")
    return 1 if any(r["rc"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
