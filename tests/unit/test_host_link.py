"""HostLink: an operator host's messages read off its pipe by the supervising thread, with
the wrapper's own notes posted in between. Real child processes, real pipes."""

from __future__ import annotations

import array
import fcntl
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import pytest

from trace_platform.worker import host_link
from trace_platform.worker.attempt import Running
from trace_platform.worker.host_link import HostLink
from trace_platform.worker.reports import foreign
from trace_platform.worker.wrapper import Wrapper


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
    """The wait for its exit never holds up a `get` past its timeout: the supervisor goes on
    heartbeating (and seeing a cancel) meanwhile."""
    monkeypatch.setattr(host_link, "_EXIT_WAIT", 1.0)
    link = _link(procs, "import os, time; os.close(1); time.sleep(30)")
    began = time.monotonic()
    assert link.get(0.2) is None
    assert time.monotonic() - began < 0.6
    assert _all(link) == [{"type": "exit", "returncode": None}]
    assert link.proc.poll() is None  # still running: the wrapper kills it


def test_an_exit_is_seen_while_a_process_the_host_started_holds_its_output(
    procs: list[Any],
) -> None:
    """No end of output comes while a descendant holds the pipe: the exit itself is seen,
    after the lines written before it."""
    script = (
        "import subprocess, sys, json\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print(json.dumps({'type': 'child', 'pid': child.pid}), flush=True)\n"
        "sys.exit(4)\n"
    )
    link = _link(procs, script)
    got = _all(link)
    try:
        assert [m["type"] for m in got] == ["child", "exit"]
        assert got[-1]["returncode"] == 4
    finally:
        os.kill(got[0]["pid"], signal.SIGKILL)


def test_a_get_with_no_time_left_still_takes_what_the_pipe_holds(procs: list[Any]) -> None:
    """A supervisor whose heartbeat overran the next beat asks with timeout 0: what the host
    said meanwhile must come, or it heartbeats on and never reads it."""
    link = _link(procs, 'print(\'{"type": "done"}\', flush=True); import time; time.sleep(30)')
    time.sleep(0.5)  # the line is in the pipe
    assert link.get(0) == {"type": "done"}


def test_a_note_posted_comes_after_the_lines_already_read(procs: list[Any]) -> None:
    """Two store requests in one write (the second breaks the protocol: it does not wait for
    the first's reply): both were read when the first was taken, so the first's "store_done",
    posted then, comes after the second, which the supervisor therefore refuses."""
    script = (
        "import sys, time\n"
        'sys.stdout.write(\'{"type": "store", "n": 1}\\n{"type": "store", "n": 2}\\n\')\n'
        "sys.stdout.flush(); time.sleep(30)\n"
    )
    link = _link(procs, script)
    assert link.get(10) == {"type": "store", "n": 1}
    link.post({"type": "store_done"})
    assert link.get(10) == {"type": "store", "n": 2}
    assert link.get(10) == {"type": "store_done"}


def test_a_long_line_written_in_small_pieces_arrives_whole(
    procs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_link, "MAX_LINE", 2_000_000)
    script = (
        "import sys, json\n"
        "line = json.dumps({'type': 'done', 'pad': 'x' * 1_900_000}) + '\\n'\n"
        "for i in range(0, len(line), 4096):\n"
        "    sys.stdout.write(line[i:i + 4096]); sys.stdout.flush()\n"
    )
    got = _all(_link(procs, script))
    assert [m["type"] for m in got] == ["done", "exit"] and len(got[0]["pad"]) == 1_900_000


def _supervised(
    procs: list[Any],
    script: Callable[[str], str],
    beat_takes: float = 0.0,
    serve_store: Callable[..., None] | None = None,
) -> tuple[list[tuple[str, dict[str, Any]]], list[float]]:
    """`Wrapper._supervise` over a host running `script(run label)`, heartbeats taking
    `beat_takes` seconds (`serve_store`: what answers its store calls): what it reported, and
    when it beat."""
    claim = SimpleNamespace(
        heartbeat_seconds=0.2,
        lease_until=datetime.now(UTC) + timedelta(seconds=30),
        task_id=uuid4(),
        attempt=1,
    )
    proc = _host(script(f"{claim.task_id}/1"))
    procs.append(proc)
    host = SimpleNamespace(proc=proc, link=HostLink(proc), kill=proc.kill, log_tail=lambda: "")
    beats: list[float] = []

    def heartbeat(claim: Any, progress: Any, timeout: float) -> Any:
        beats.append(time.monotonic())
        time.sleep(beat_takes)
        return SimpleNamespace(
            lease_until=datetime.now(UTC) + timedelta(seconds=30), cancel_requested=False
        )

    reported: list[tuple[str, dict[str, Any]]] = []
    wrapper = SimpleNamespace(
        client=SimpleNamespace(heartbeat=heartbeat),
        visibility=60,
        _extend=lambda msg: None,
        _report=lambda claim, outcome, **kw: reported.append((outcome, kw)),
        _serve_store=serve_store,
    )
    wrapper._broken = lambda *a, **kw: Wrapper._broken(wrapper, *a, **kw)  # type: ignore[arg-type]
    scoped, task = SimpleNamespace(used=False), SimpleNamespace(operator_state_revision=0)
    run = Running(claim, None, task, host, None, [], scoped)  # type: ignore[arg-type]
    supervise = threading.Thread(
        target=Wrapper._supervise, args=(wrapper, run, threading.Event()), daemon=True
    )
    supervise.start()
    supervise.join(8)
    return reported, beats


def test_a_slow_heartbeat_does_not_stop_the_supervisor_reading_its_host(
    procs: list[Any],
) -> None:
    """Heartbeats that take longer than the beat (a slow API) come back to back; the host's
    outcome, said meanwhile, must still be read between them and reported."""
    reported, beats = _supervised(
        procs,
        lambda run: (
            "import json, time; time.sleep(0.5)\n"
            "print(json.dumps({'type': 'failed', 'error': 'x', 'retryable': False,"
            f" 'run': {run!r}}}), flush=True)\n"
            "time.sleep(30)\n"
        ),
        beat_takes=0.25,  # longer than the beat (0.2 s)
    )
    assert [r[0] for r in reported] == ["failed"] and len(beats) < 8, (reported, len(beats))


@pytest.mark.parametrize("said", ["'another/1'", "None"])
def test_a_message_naming_another_run_fails_the_attempt_retryably(
    procs: list[Any], said: str
) -> None:
    """What an earlier task left running in the host (its run named in what it says), or a
    host that names none, cannot end this attempt: it fails, to be tried again elsewhere."""
    reported, _ = _supervised(
        procs,
        lambda run: (
            "import json, time\n"
            f"print(json.dumps({{'type': 'done', 'final_events': [], 'run': {said}}}), flush=True)\n"
            "time.sleep(30)\n"
        ),
    )
    ((outcome, kw),) = reported
    assert outcome == "failed" and kw["retryable"] is True, reported
    assert "operator host broke the protocol: a 'done' message for" in kw["error"]
    assert ("no run" if said == "None" else "run 'another/1'") in kw["error"]


def test_an_end_with_a_store_call_still_open_retires_the_host(procs: list[Any]) -> None:
    """A thread of the task still waits on a store reply when the task ends: the end is
    reported, and the host is not kept (that reply, or its note, would reach the next task)."""
    answered = threading.Event()

    def slow_store(proc: Any, link: Any, scoped: Any, req: Any) -> None:
        time.sleep(1.0)
        answered.set()

    reported, _ = _supervised(
        procs,
        lambda run: (
            "import json, time\n"
            f"print(json.dumps({{'type': 'store', 'op': 'list', 'key': '', 'run': {run!r}}}))\n"
            f"print(json.dumps({{'type': 'done', 'final_events': [], 'run': {run!r}}}),"
            " flush=True)\n"
            "time.sleep(30)\n"
        ),
        serve_store=slow_store,
    )
    assert [r[0] for r in reported] == ["succeeded"], reported
    assert not answered.is_set()  # reported without waiting for the call
    assert procs[-1].wait(5) is not None  # and the host killed


@pytest.mark.parametrize(
    "line",
    [
        '{"type": "exit", "returncode": 0}',
        '{"type": "exit"}',
        '{"type": "protocol_error", "error": "x"}',
        '{"type": "store_done"}',
    ],
)
def test_a_host_cannot_say_what_only_the_wrapper_posts(procs: list[Any], line: str) -> None:
    """An `exit` while it runs on, a `store_done` (a second store call), a protocol error in
    its own words: the wrapper's notes, never the host's."""
    link = _link(procs, f"print({line!r}, flush=True); import time; time.sleep(30)")
    got = link.get(5)
    assert got is not None and got["type"] == "protocol_error", got
    assert "only the wrapper posts" in got["error"]


def test_a_run_named_by_no_string_is_foreign_and_said_safely() -> None:
    claim = SimpleNamespace(
        heartbeat_seconds=1, lease_until=datetime.now(UTC), task_id=uuid4(), attempt=1
    )
    run = Running(claim, None, None, None, None, [], None)  # type: ignore[arg-type]
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"a": deep}
    assert foreign({"type": "event", "run": deep}, run) == (
        f"a 'event' message for a run named by a JSON dict during run '{claim.task_id}/1'"
    )
    assert foreign({"type": "event", "run": f"{claim.task_id}/1"}, run) is None
    assert foreign({"type": "ready"}, run) is None  # not a run's message


def test_a_long_line_already_in_the_pipe_comes_in_one_get_with_no_time_left(
    procs: list[Any],
) -> None:
    """Behind a slow heartbeat every `get` has no time left: a line longer than one read
    already in the pipe must come whole in the first `get`, not one read per heartbeat.
    The host widens its pipe to hold the whole line and says when it is written, so what
    is measured is the reader, never how soon a loaded machine runs the writer."""
    size = 900 * 1024  # over three reads (_CHUNK), under the widened pipe
    assert size > 3 * host_link._CHUNK
    script = (
        "import fcntl, json, sys, time\n"
        "fcntl.fcntl(1, fcntl.F_SETPIPE_SZ, 1 << 20)\n"
        f"sys.stdout.write(json.dumps({{'type': 'done', 'pad': 'x' * {size}}}) + '\\n')\n"
        "sys.stdout.flush(); time.sleep(30)\n"
    )
    link = _link(procs, script)
    written = time.monotonic() + 30
    while not _pipe_holds(link, size):
        assert time.monotonic() < written, "the host did not write its line"
        time.sleep(0.01)
    msg = link.get(0)
    assert msg is not None, "a line in the pipe took more than one get"
    assert msg["type"] == "done" and len(msg["pad"]) == size


def _pipe_holds(link: HostLink, size: int) -> bool:
    """Whether the host's pipe holds at least `size` unread bytes (FIONREAD)."""
    n = array.array("i", [0])
    fcntl.ioctl(link.proc.stdout.fileno(), termios.FIONREAD, n)  # type: ignore[union-attr]
    return n[0] >= size


def test_a_line_nested_deeper_than_the_stack_is_a_protocol_error(procs: list[Any]) -> None:
    script = (
        "import sys\n"
        "sys.stdout.write('{\"type\": \"progress\", \"p\": ' + '[' * 100000 + ']' * 100000 + '}\\n')\n"
    )
    assert _all(_link(procs, script))[0] == {
        "type": "protocol_error",
        "error": "a message that is not a JSON object",
    }


def test_without_a_pidfd_an_exit_is_still_seen_while_a_process_the_host_started_holds_its_output(
    procs: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An old kernel (or a sandbox) without pidfd_open: the exit is polled for. The host's
    last line, unterminated, still comes before it."""

    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    script = (
        "import subprocess, sys, json\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "sys.stdout.write(json.dumps({'type': 'child', 'pid': child.pid}))\n"
        "sys.exit(5)\n"
    )
    link = _link(procs, script)
    began = time.monotonic()
    got = _all(link)
    try:
        assert [m["type"] for m in got] == ["child", "exit"] and got[-1]["returncode"] == 5
        assert time.monotonic() - began < 5.0
    finally:
        os.kill(got[0]["pid"], signal.SIGKILL)


def test_an_unterminated_last_line_comes_before_the_exit_while_a_descendant_holds_the_pipe(
    procs: list[Any],
) -> None:
    script = (
        "import subprocess, sys, json\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "sys.stdout.write(json.dumps({'type': 'child', 'pid': child.pid}))\n"
        "sys.exit(0)\n"
    )
    got = _all(_link(procs, script))
    try:
        assert [m["type"] for m in got] == ["child", "exit"]
    finally:
        os.kill(got[0]["pid"], signal.SIGKILL)


def test_a_get_after_close_is_an_exit_not_a_read_of_closed_descriptors(
    procs: list[Any],
) -> None:
    link = _link(procs, "import time; time.sleep(30)")
    link.close()
    assert link.get(0.1) == {"type": "exit", "returncode": None}


def test_a_closed_link_takes_no_more_notes(procs: list[Any]) -> None:
    link = _link(procs, "import time; time.sleep(30)")
    link.close()
    link.post({"type": "store_done"})  # a late store answer after the host's kill
    link.close()
    assert link.get(0) == {"type": "exit", "returncode": None}  # the note was not taken
