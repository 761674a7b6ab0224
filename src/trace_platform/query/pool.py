"""The API process's side of the query workers: a small pool of runner.py processes.

Workers start on demand (up to `size`) and are reused, one query at a time each. The parent
sends a pinned plan, then waits for the answer until the query's time limit plus a grace period;
past that it SIGKILLs the worker and reports the time limit. A worker that was killed, crashed,
or asked to be retired is reaped and replaced in the background, so the next query finds a warm
one. Nothing a killed worker wrote is ever decoded: an answer counts only once its frame arrived
whole, and its announced size is checked before any of it is read."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trace_platform
from trace_platform.query import wire

log = logging.getLogger(__name__)

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_F_SETPIPE_SZ = 1031
# What a worker's environment keeps of the API process's (no DSNs, tokens, keys).
_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME", "SSL_CERT_FILE", "SSL_CERT_DIR")


def parse_size(text: str) -> int:
    """'2GB' (DuckDB's units: GB = 1000³, GiB = 1024³) as bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 2GB, 512MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker is started with (sent over its pipe, never on argv or in its env)."""

    pg_dsn: str
    s3: dict[str, Any] | None
    memory_limit_bytes: int
    headroom_bytes: int
    cache_size: int = 4
    start_timeout: float = 60.0

    def init_frame(self) -> dict[str, Any]:
        return {
            "pg_dsn": self.pg_dsn,
            "s3": self.s3,
            "memory_limit_bytes": self.memory_limit_bytes,
            "headroom_bytes": self.headroom_bytes,
            "cache_size": self.cache_size,
        }


class WorkerStopped(Exception):
    """The worker gave no answer: `reason` is 'timeout' (the parent killed it), 'oversize'
    (it announced more than allowed; killed) or 'died' (it ended by itself: `returncode`)."""

    def __init__(self, reason: str, returncode: int | None = None) -> None:
        super().__init__(reason, returncode)
        self.reason = reason
        self.returncode = returncode


class NoWorker(Exception):
    """No worker became free in time, or one could not be started."""


class Worker:
    def __init__(self, proc: subprocess.Popen[bytes], req: int, resp: int) -> None:
        self.proc = proc
        self.req = req
        self.resp = resp
        self.info: dict[str, Any] = {}
        self.queries = 0
        self._stopped = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, *, kill: bool, wait: float = 2.0) -> int | None:
        """Ends the worker and reaps it: SIGKILL now, or close its request pipe (it exits when
        idle) and SIGKILL only if it is still there after `wait` seconds. Idempotent: its pipes
        are closed once (a descriptor closed twice may by then be another thread's)."""
        if self._stopped:
            return self.proc.returncode
        self._stopped = True
        if kill and self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.close(self.req)
        try:
            rc = self.proc.wait(timeout=None if kill else wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self.resp)
        return rc


class WorkerPool:
    def __init__(self, size: int, config: WorkerConfig, *, kill_grace: float = 1.0) -> None:
        if size < 1:
            raise ValueError("a query worker pool needs at least one worker")
        self.size = size
        self.config = config
        self.kill_grace = kill_grace
        self._idle: list[Worker] = []
        self._busy: set[Worker] = set()
        self._live = 0  # idle + busy + starting
        self._cond = threading.Condition()
        self._closed = False
        self._workdir = Path(tempfile.mkdtemp(prefix="trace-query-"))
        self._workdir.chmod(0o700)
        self.started = 0  # workers started over the pool's life (tests and benches read it)
        self.replaced = 0

    # -- workers ------------------------------------------------------------------------------
    def _spawn(self) -> Worker:
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        with contextlib.suppress(OSError):  # fewer round trips for big answers
            fcntl.fcntl(resp_w, _F_SETPIPE_SZ, 1 << 20)
        env = {k: v for k in _ENV_KEEP if (v := os.environ.get(k))}
        env["PYTHONPATH"] = str(Path(trace_platform.__file__).resolve().parents[1])
        env["MALLOC_ARENA_MAX"] = "2"  # glibc arenas reserve address space under RLIMIT_AS
        env["TMPDIR"] = str(self._workdir)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "trace_platform.query.runner", str(req_r), str(resp_w)],
                pass_fds=(req_r, resp_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                cwd=self._workdir,  # where DuckDB spills, not the API's directory
                env=env,
                start_new_session=True,  # no terminal signals; the pool stops it
            )
        except BaseException:
            for fd in (req_r, req_w, resp_r, resp_w):
                os.close(fd)
            raise
        os.close(req_r)
        os.close(resp_w)
        w = Worker(proc, req_w, resp_r)
        try:
            wire.send(req_w, self.config.init_frame())
            info, _ = wire.recv(
                resp_r, deadline=time.monotonic() + self.config.start_timeout, max_payload=0
            )
            if not info.get("ready"):
                raise NoWorker(f"a query worker could not start: {info.get('message', '?')}")
        except (OSError, wire.Closed, wire.TimedOut, wire.TooLarge, ValueError) as e:
            rc = w.stop(kill=True)
            raise NoWorker(f"a query worker could not start (exit {rc}): {e!r}") from None
        except BaseException:
            w.stop(kill=True)
            raise
        w.info = info
        with self._cond:
            self.started += 1
        return w

    def _start_soon(self, *, replacing: bool) -> bool:
        """Starts a worker in the background (unless closed or full): in place of one that
        ended, or ahead of demand."""
        with self._cond:
            if self._closed or self._live >= self.size:
                return False
            self._live += 1
            if replacing:
                self.replaced += 1

        def start() -> None:
            try:
                w = self._spawn()
            except Exception as e:
                log.warning("query worker start failed: %s", e)
                with self._cond:
                    self._live -= 1
                    self._cond.notify()
                return
            with self._cond:
                if not self._closed:
                    self._idle.append(w)
                    self._cond.notify()
                    return
                self._live -= 1
            w.stop(kill=True)

        threading.Thread(target=start, name="query-worker-start", daemon=True).start()
        return True

    def prestart(self, n: int | None = None, *, wait: float | None = None) -> None:
        """Starts workers ahead of demand (all `size` by default); with `wait`, until that many
        are idle or the time is up."""
        n = self.size if n is None else min(n, self.size)
        with self._cond:
            missing = n - self._live
        for _ in range(max(0, missing)):
            self._start_soon(replacing=False)
        if wait is not None:
            deadline = time.monotonic() + wait
            with self._cond:
                while len(self._idle) < n and time.monotonic() < deadline:
                    self._cond.wait(deadline - time.monotonic())

    def acquire(self, wait: float) -> Worker:
        deadline = time.monotonic() + wait
        dead: list[Worker] = []
        try:
            with self._cond:
                while True:
                    if self._closed:
                        raise NoWorker("the Query Service is shutting down")
                    while self._idle:
                        w = self._idle.pop()
                        if w.alive():
                            self._busy.add(w)
                            return w
                        dead.append(w)  # ended while idle (killed from outside)
                        self._live -= 1
                    if self._live < self.size:
                        self._live += 1
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise NoWorker(f"all {self.size} query workers stayed busy for {wait:g} s")
                    self._cond.wait(left)
        finally:
            for w in dead:
                w.stop(kill=True)
        try:
            w = self._spawn()
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._busy.add(w)
        return w

    def release(self, w: Worker, *, keep: bool) -> None:
        with self._cond:
            self._busy.discard(w)
            if keep and not self._closed and w.alive():
                self._idle.append(w)
                self._cond.notify()
                return
            self._live -= 1
            self._cond.notify()
        w.stop(kill=not keep)
        self._start_soon(replacing=True)

    # -- queries ------------------------------------------------------------------------------
    def run(
        self, request: dict[str, Any], *, timeout: float, wait: float, max_payload: int
    ) -> tuple[dict[str, Any], bytearray]:
        """Runs one request on a worker: its answer header and payload, or WorkerStopped.
        `timeout` is the query's own time limit; the worker is killed at timeout + grace."""
        for attempt in (1, 2):
            w = self.acquire(wait)
            keep = False
            try:
                try:
                    wire.send(w.req, request)
                except OSError:  # it ended between acquire and send: nothing ran; try another
                    if attempt == 2:
                        raise WorkerStopped("died", w.stop(kill=True)) from None
                    continue
                deadline = time.monotonic() + timeout + self.kill_grace
                try:
                    header, payload = wire.recv(w.resp, deadline=deadline, max_payload=max_payload)
                except wire.TimedOut:
                    raise WorkerStopped("timeout") from None
                except wire.TooLarge:
                    raise WorkerStopped("oversize") from None
                except (wire.Closed, OSError, ValueError):
                    raise WorkerStopped("died", w.stop(kill=False)) from None
                keep = not header.get("exit")
                w.queries += 1
                return header, payload
            finally:
                self.release(w, keep=keep)
        raise AssertionError("unreachable")

    def pids(self) -> dict[str, list[int]]:
        """The workers' pids, idle and busy (tests and benches read it)."""
        with self._cond:
            return {
                "idle": [w.pid for w in self._idle],
                "busy": [w.pid for w in self._busy],
            }

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._cond.notify_all()
        for w in idle:
            w.stop(kill=False)
        shutil.rmtree(self._workdir, ignore_errors=True)
