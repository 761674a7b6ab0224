"""The README's tutorial, run as written: every block in order, in bash, against a real Lite
stack started by the tutorial's own `trace up` (over this test's database)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.tutorial import ROOT, Block, tutorial_blocks
from trace_platform.db.embedded import free_port

pytestmark = pytest.mark.slow

UP_LINE = "Trace Lite up"


def bash(block: Block, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"README line {block.line}: exit {out.returncode}\n{text}"
    return text


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> None:
    if block.until is None:
        text = bash(block, cwd, env)
    else:
        deadline = time.monotonic() + 300
        while block.until not in (text := bash(block, cwd, env)):
            assert time.monotonic() < deadline, f"README line {block.line}: never {block.until}"
            time.sleep(1)
    for expected in block.expect:
        assert expected in text, f"README line {block.line}: no {expected!r} in\n{text}"


def start_background(block: Block, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    log = (cwd / "background.log").open("w")
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: stopped as a whole (Ctrl-C)
    )
    deadline = time.monotonic() + 120
    while UP_LINE not in (cwd / "background.log").read_text():
        text = (cwd / "background.log").read_text()
        assert proc.poll() is None, f"README line {block.line} exited:\n{text}"
        assert time.monotonic() < deadline, f"README line {block.line} did not start:\n{text}"
        time.sleep(0.1)
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C: SIGINT to the group (`trace up` stops its workers and its API)."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def test_the_readme_tutorial_runs_as_written(dsn: str, tmp_path: Path) -> None:
    steps = tutorial_blocks()
    assert steps and all(b.mode for b in steps), "every tutorial block has a test marker"
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")  # as in a checkout after `make test`
    env = {
        **os.environ,
        "COLUMNS": "200",  # tables are not wrapped
        "TRACE_STATE_DSN": dsn,  # this test's database instead of an embedded cluster
        "TRACE_API_PORT": str(free_port()),
        "TRACE_WORKER_DRAIN_SECONDS": "5",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    env.pop("TRACE_OPERATOR_REGISTRY", None)  # the production operators, as a user has them
    env.pop("TRACE_HOME", None)
    # The tutorial's commands find `trace` once the first block activated the virtualenv; the
    # later blocks are run in the second terminal, where the user activated it too.
    activated = {**env, "PATH": f"{ROOT / '.venv' / 'bin'}:{env['PATH']}"}
    running: list[subprocess.Popen[str]] = []
    try:
        for block in steps:
            began = time.monotonic()
            if block.mode == "file":
                assert block.path is not None
                (tmp_path / block.path).write_text(block.text)
            elif block.mode == "background":
                running.append(start_background(block, tmp_path, env))
            else:
                run_block(block, tmp_path, activated)
            # Shown when the test fails: which step took the time.
            print(f"README line {block.line} ({block.mode}): {time.monotonic() - began:.1f} s")
    finally:
        for proc in running:
            stop(proc)
