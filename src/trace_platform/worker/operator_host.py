"""The operator host launcher: starts and stops the child program (`worker/host_main.py`)
that runs operators for one tenant at a time, and speaks its JSON-lines protocol from the
wrapper's side (`write_msg` out, `OperatorHost.link` in: see `worker/host_link.py`)."""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import termios
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trace_platform.contract import TaskPayload
from trace_platform.sandbox import Policy
from trace_platform.sandbox.hostdir import HostDir, TaskDirs, host_command, host_env
from trace_platform.sandbox.netns import listen_in
from trace_platform.worker.host_link import HostLink

if TYPE_CHECKING:
    from trace_platform.metrics.worker import WorkerMetrics


class HostUnresponsive(RuntimeError):
    pass


# Held while a host's stdin is closed, and while a writer takes its own handle on it: a
# writer in another thread (a store reply) never writes to a descriptor number that a closed
# stdin freed and the next host's pipe took (one tenant's reply into another's host).
_STDIN = threading.Lock()
# One writer at a time per host: a store reply (its own thread) and the next task's run
# message could otherwise interleave, past the pipe's atomic size, into one corrupt line.
_WRITERS: weakref.WeakKeyDictionary[subprocess.Popen[bytes], threading.Lock] = (
    weakref.WeakKeyDictionary()
)


def write_msg(
    proc: subprocess.Popen[bytes], msg: dict[str, Any] | bytes, timeout: float = 30.0
) -> None:
    """One message to a host (a dict, or its line already written); a host that stops reading
    for `timeout` (the wait for another writer included) is unresponsive, one whose input is
    closed (killed) raises BrokenPipeError."""
    deadline = time.monotonic() + timeout
    with _STDIN:
        if proc.stdin is None or proc.stdin.closed:
            raise BrokenPipeError("the operator host's input is closed")
        fd = os.dup(proc.stdin.fileno())  # the same pipe, whatever is closed meanwhile
        writer = _WRITERS.setdefault(proc, threading.Lock())
    try:
        if not writer.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise HostUnresponsive("the operator host stopped reading its input")
        try:
            line = msg if isinstance(msg, bytes) else (json.dumps(msg) + "\n").encode()
            view = memoryview(line)
            writable = select.poll()
            writable.register(fd, select.POLLOUT)
            while view:
                if not writable.poll(max(0.0, deadline - time.monotonic()) * 1000):
                    raise HostUnresponsive("the operator host stopped reading its input")
                view = view[os.write(fd, view) :]
        finally:
            writer.release()
    finally:
        os.close(fd)


class OperatorHost:
    """One child process running operators for one tenant (org, DAG) at a time: restarted
    when it dies, is killed, or the next task belongs to another tenant, so nothing of one
    user's task (process state, Spark JVM, files) is there for another's."""

    def __init__(
        self,
        home: Path,
        name: str,
        policy: Policy,
        *,
        extra_env: dict[str, str] | None = None,
        extra_binds: list[Path] | None = None,
        limits: dict[str, Any] | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        """`limits`: the sandboxed host's resource limits (`hostdir.resource_limits`);
        `metrics`: the worker's, counting this host's starts."""
        self.home = home.resolve()
        self.name = name
        self.policy = policy
        self.log_path = home / "logs" / f"worker-{name}.log"
        self.extra_env = extra_env or {}
        self.extra_binds = extra_binds or []
        self.limits = limits or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir: HostDir | None = None
        self.tenant: tuple[Any, ...] | None = None
        self.link: HostLink | None = None  # the running process's messages
        self.metrics = metrics
        self.started = False  # a process was started before

    def runs_for(self, tenant: tuple[Any, ...]) -> bool:
        """Whether this host runs, for `tenant` (its next task then starts at once)."""
        return self.proc is not None and self.proc.poll() is None and self.tenant == tenant

    def ensure(self, tenant: tuple[Any, ...]) -> None:
        if self.runs_for(tenant):
            return
        if self.metrics is not None:
            alive = self.proc is not None and self.proc.poll() is None
            why = "tenant" if alive else "restart" if self.started else "first"
            self.metrics.host_starts.labels(why).inc()
        self.started = True
        self.kill()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.dir = HostDir.create(self.home / "sandbox", self.name, self.policy)
        argv, plan = host_command(self.dir, self.home, self.extra_binds, self.limits)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=fd,
                env={**host_env(self.dir, self.extra_env), **plan},
                cwd=self.dir.home,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(fd)
        assert self.proc.stdin is not None
        os.set_blocking(self.proc.stdin.fileno(), False)  # writes have a deadline (send)
        self.tenant = tenant
        self.link = HostLink(self.proc)
        ready = self.link.get(timeout=60)
        if ready is None or ready.get("type") != "ready":
            raise RuntimeError(
                f"operator host did not start: {ready or 'no word in 60 s'}\n{self.log_tail()}"
            )

    def send(self, msg: dict[str, Any] | bytes, timeout: float = 30.0) -> None:
        assert self.proc is not None
        write_msg(self.proc, msg, timeout)

    def unread_input(self) -> int:
        """Bytes written to the host's input that it has not read, even once it has exited
        (FIONREAD on the pipe's write end: Linux counts the pipe's contents from either end)."""
        with _STDIN:
            if self.proc is None or self.proc.stdin is None or self.proc.stdin.closed:
                return 0
            got = array.array("i", [0])
            try:
                fcntl.ioctl(self.proc.stdin.fileno(), termios.FIONREAD, got)
            except OSError:
                return 0
            return got[0]

    def new_task(self, task: TaskPayload) -> TaskDirs:
        assert self.dir is not None
        return self.dir.new_task(f"{task.task_id}-{task.attempt}")

    def recycle(self, dirs: TaskDirs) -> bool:
        """See HostDir.recycle; False when this host has since been restarted or killed."""
        return self.dir is not None and self.dir.recycle(dirs)

    def listen(self) -> socket.socket:
        """A loopback listener inside the host's network namespace (sandboxed hosts only)."""
        assert self.proc is not None and self.policy.isolated
        return listen_in(self.proc.pid)

    def kill(self, grace: float = 3.0) -> None:
        """Stop whatever runs now: SIGTERM to the process group, SIGKILL after `grace`."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        if self.proc is not None and self.proc.stdin is not None:
            with _STDIN, contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.proc = None
        self.tenant = None
        if self.link is not None:
            self.link.close()
            self.link = None
        if self.dir is not None:
            self.dir.remove()
            self.dir = None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
