"""HostLink: an operator host's messages read off its pipe by the supervising thread, with
the wrapper's own notes posted in between. Real child processes, real pipes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from trace_platform.worker import host_link
from trace_platform.worker.host_link import HostLink


def _host(script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for p in made:
        p.kill()
        p.wait()


def _link(procs: list[subprocess.Popen[bytes]], script: str) -> HostLink:
    proc = _host(script)
    procs.append(proc)
    return HostLink(proc)


def _all(link: HostLink, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Every message up to and including the end of the output (or a protocol error)."""
    got: list[dict[str, Any]] = []
    while (msg := link.get(timeout)) is not None:
        got.append(msg)
        if msg["type"] in ("exit", "protocol_error"):
            return got
    raise AssertionError(f"no end within {timeout}s after {got}")


def test_lines_come_in_order_then_the_exit_with_a_last_line_without_newline(
    procs: list[Any],
) -> None:
    script = (
        "import sys\n"
        'for i in range(3000): sys.stdout.write(\'{"type": "event", "i": %d}\\n\' % i)\n'
        'sys.stdout.write(\'{"type": "done"}\')\n'
        "sys.exit(3)\n"
    )
    got = _all(_link(procs, script))
    assert [m["i"] for m in got[:3000]] == list(range(3000))
    assert got[3000:] == [{"type": "done"}, {"type": "exit", "returncode": 3}]


def test_a_get_with_nothing_said_returns_none_after_its_timeout(procs: list[Any]) -> None:
    link = _link(procs, "import time; time.sleep(30)")
    began = time.monotonic()
    assert link.get(0.3) is None
    assert 0.25 <= time.monotonic() - began < 2.0
    assert link.get(0) is None


def test_a_note_posted_from_another_thread_wakes_the_reader_and_comes_first(
    procs: list[Any],
) -> None:
    """A store reply's "store_done" is posted before the reply is written: the host's next
    request, read after it, must not overtake it."""
    script = (
        "import sys\n"
        "sys.stdin.readline()\n"
        'print(\'{"type": "store", "n": 2}\', flush=True)\n'
        "sys.stdin.readline()\n"
    )
    link = _link(procs, script)
    assert link.proc.stdin is not None

    def serve() -> None:
        time.sleep(0.2)
        link.post({"type": "store_done"})
        link.proc.stdin.write(b"reply\n")  # type: ignore[union-attr]
        link.proc.stdin.flush()  # type: ignore[union-attr]

    threading.Thread(target=serve).start()
    began = time.monotonic()
    assert link.get(10) == {"type": "store_done"}
    assert time.monotonic() - began < 2.0  # woken by the post, not by the timeout
    assert link.get(10) == {"type": "store", "n": 2}


def test_a_line_that_is_no_json_object_ends_the_reading_after_the_lines_before_it(
    procs: list[Any],
) -> None:
    script = (
        'print(\'{"type": "progress"}\'); print(\'[1, 2]\'); print(\'{"type": "done"}\')\n'
        "import time; time.sleep(30)\n"
    )
    link = _link(procs, script)
    got = _all(link)
    assert got == [
        {"type": "progress"},
        {"type": "protocol_error", "error": "a message that is not a JSON object"},
    ]
    assert link.get(0.1) == got[-1]  # nothing after it is read


def test_a_line_over_the_limit_is_a_protocol_error_without_buffering_it_all(
    procs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_link, "MAX_LINE", 1000)
    script = (
        "import sys, time\n"
        'print(\'{"type": "progress"}\', flush=True)\n'
        "sys.stdout.write('x' * 50000); sys.stdout.flush(); time.sleep(30)\n"
    )
    got = _all(_link(procs, script))
    assert got == [
        {"type": "progress"},
        {"type": "protocol_error", "error": "a message over 1000 bytes"},
    ]


def test_a_host_that_closes_its_output_and_runs_on_is_an_exit_without_status(
    procs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_link, "_EXIT_WAIT", 0.2)
    link = _link(procs, "import os, time; os.close(1); time.sleep(30)")
    assert _all(link) == [{"type": "exit", "returncode": None}]
    assert link.proc.poll() is None  # still running: the wrapper kills it


def test_a_closed_link_takes_no_more_notes(procs: list[Any]) -> None:
    link = _link(procs, "import time; time.sleep(30)")
    link.close()
    link.post({"type": "store_done"})  # a late store answer after the host's kill
    link.close()
