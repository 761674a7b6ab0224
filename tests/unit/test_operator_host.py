"""write_msg: the wrapper's writes into an operator host's input. Real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from trace_platform.worker import operator_host
from trace_platform.worker.operator_host import HostUnresponsive, write_msg


def _idle_host() -> subprocess.Popen[bytes]:
    """A host that never reads its input."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], stdin=subprocess.PIPE
    )
    assert proc.stdin is not None
    os.set_blocking(proc.stdin.fileno(), False)
    return proc


def test_a_write_under_way_never_lands_in_the_pipe_that_took_its_closed_stdins_number() -> None:
    """A store reply is written from its own thread while the wrapper may kill the host
    (closing its stdin) and start the next tenant's, whose pipe can take the freed number.
    The reply must go on to the pipe it began on, never into the new one."""
    proc = _idle_host()
    new_r, new_w = os.pipe()
    try:
        raised: list[BaseException] = []

        def reply() -> None:
            try:  # more than a pipe holds: it waits for the host to read
                write_msg(proc, {"type": "store_reply", "pad": "x" * 1_000_000}, timeout=1.0)
            except BaseException as e:
                raised.append(e)

        writer = threading.Thread(target=reply)
        writer.start()
        time.sleep(0.3)  # the pipe is full; the writer waits to write more
        assert proc.stdin is not None
        freed = proc.stdin.fileno()
        with operator_host._STDIN:  # as OperatorHost.kill closes it
            proc.stdin.close()
        os.dup2(new_w, freed)  # the next host's pipe, under the freed number
        writer.join(5)
        os.set_blocking(new_r, False)
        with pytest.raises(BlockingIOError):
            os.read(new_r, 1)  # nothing was written into the new pipe
        assert len(raised) == 1 and isinstance(raised[0], HostUnresponsive)
        os.close(freed)
    finally:
        proc.kill()
        proc.wait()
        os.close(new_r)
        os.close(new_w)


def test_a_write_to_a_closed_input_is_a_broken_pipe() -> None:
    proc = _idle_host()
    try:
        assert proc.stdin is not None
        proc.stdin.close()
        with pytest.raises(BrokenPipeError):
            write_msg(proc, {"type": "run"})
    finally:
        proc.kill()
        proc.wait()


def test_two_writers_to_one_host_never_interleave_their_lines() -> None:
    """A store reply (its own thread) and the next run message, each larger than the pipe
    writes atomically: each line reaches the host whole."""
    echo = (
        "import json, sys\n"
        "for line in sys.stdin:\n"
        "    msg = json.loads(line)\n"
        "    print(msg['who'], len(msg['pad']), flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", echo], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    os.set_blocking(proc.stdin.fileno(), False)
    try:

        def send(who: str) -> None:
            for _ in range(5):
                write_msg(proc, {"type": "store_reply", "who": who, "pad": "x" * 300_000})

        writers = [threading.Thread(target=send, args=(w,)) for w in ("a", "b")]
        for w in writers:
            w.start()
        for w in writers:
            w.join(30)
        proc.stdin.close()
        lines = proc.stdout.read().decode().split()
        assert proc.wait(10) == 0, "the host read a corrupt line"
        assert sorted(lines[0::2]) == ["a"] * 5 + ["b"] * 5
        assert set(lines[1::2]) == {"300000"}
    finally:
        proc.kill()
        proc.wait()
