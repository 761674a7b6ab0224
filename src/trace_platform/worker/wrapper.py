"""The worker wrapper: the platform contract around operator code, and its security boundary.

wake-up -> claim lease (Postgres, via the Dispatcher) -> task-fetch -> run the operator in the
host process while heartbeating and extending queue visibility -> forward events -> report
completion (attempt-fenced) -> ack the wake-up. Wake-ups are only hints: anything not claimable
is acknowledged and dropped.
"""

from __future__ import annotations

import json
import logging
import os
import queue as stdqueue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

from trace_platform.dispatcher import models as m
from trace_platform.operators import TRUSTED_OPERATORS
from trace_platform.queue import payloads
from trace_platform.queue.driver import Message, QueueDriver
from trace_platform.worker.client import ApiError, DispatcherClient

log = logging.getLogger(__name__)

# Environment the operator host never inherits: internal credentials and database access.
_SCRUB_PREFIXES = ("TRACE_", "PG", "AWS_", "DATABASE_URL")


class OperatorHost:
    """One long-lived child process running operators; restarted if it dies or is killed."""

    def __init__(self, log_path: Path, workdir: Path) -> None:
        self.log_path = log_path
        self.workdir = workdir
        self.proc: subprocess.Popen[str] | None = None
        self.messages: stdqueue.Queue[dict[str, Any]] = stdqueue.Queue()

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB_PREFIXES)}
        env["TRACE_HOST_LOG"] = str(self.log_path)
        env["TRACE_HOST_WORKDIR"] = str(self.workdir)
        return env

    def ensure(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.messages = stdqueue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trace_platform.worker.host"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            text=True,
            env=self._env(),
            start_new_session=True,
        )
        threading.Thread(target=self._read, args=(self.proc, self.messages), daemon=True).start()
        ready = self.messages.get(timeout=60)
        if ready.get("type") != "ready":
            raise RuntimeError(f"operator host did not start: {ready}")

    @staticmethod
    def _read(proc: subprocess.Popen[str], out: stdqueue.Queue[dict[str, Any]]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                out.put(json.loads(line))
            except json.JSONDecodeError:
                continue
        out.put({"type": "exit", "returncode": proc.wait()})

    def run(self, task: m.TaskPayload, env: dict[str, str] | None = None) -> None:
        """`env` (the slot's env and secrets) is set in the host only while this task runs."""
        self.ensure()
        assert self.proc is not None and self.proc.stdin is not None
        stdin: IO[str] = self.proc.stdin
        msg = {"type": "run", "task": task.model_dump(mode="json"), "env": env or {}}
        stdin.write(json.dumps(msg) + "\n")
        stdin.flush()

    def kill(self, grace: float = 3.0) -> None:
        """Stop whatever runs now: SIGTERM to the process group, SIGKILL after `grace`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Wrapper:
    def __init__(
        self,
        driver: QueueDriver,
        client: DispatcherClient,
        *,
        queue_name: str = "tasks",
        worker_id: str | None = None,
        home: Path = Path(".trace"),
        visibility_seconds: float = 60.0,
        wait_seconds: float = 5.0,
        task_env: dict[str, str] | None = None,
        trusted_env: dict[str, str] | None = None,
    ) -> None:
        """`task_env`: set for every operator run (the object store it writes to);
        `trusted_env`: added only for trusted platform operators (a sink's data DSN)."""
        self.driver = driver
        self.client = client
        self.queue_name = queue_name
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.visibility = visibility_seconds
        self.task_env = task_env or {}
        self.trusted_env = trusted_env or {}
        self.wait_seconds = wait_seconds
        safe_id = self.worker_id.replace(":", "_").replace("/", "_")
        self.host = OperatorHost(home / "logs" / f"worker-{safe_id}.log", home / "work" / safe_id)
        self.tasks_run = 0

    # -- main loop -----------------------------------------------------------------------
    def run(self, stop: threading.Event, max_tasks: int | None = None) -> None:
        failures = 0
        try:
            while not stop.is_set():
                try:
                    msgs = self.driver.receive(
                        self.queue_name, 1, self.visibility, self.wait_seconds
                    )
                    for msg in msgs:
                        self.handle(msg, stop)
                    failures = 0
                except Exception:  # database or API unreachable: back off, never die
                    failures += 1
                    log.exception("worker loop error (%d in a row)", failures)
                    stop.wait(min(30.0, 0.5 * 2 ** min(failures, 6)))
                if max_tasks is not None and self.tasks_run >= max_tasks:
                    return
        finally:
            self.host.kill()

    def handle(self, msg: Message, stop: threading.Event | None = None) -> None:
        try:
            wake = payloads.decode(msg.payload)
        except payloads.PayloadError as e:
            self.driver.nack(self.queue_name, msg.receipt, f"poison message: {e}")
            return
        if not isinstance(wake, payloads.TaskWakeup):
            self.driver.nack(self.queue_name, msg.receipt, f"not a task wake-up: kind={wake.kind}")
            return
        try:
            claim = self.client.claim(wake.task_id, self.worker_id, wake.start_day)
        except ApiError as e:
            if e.status in (404, 409):  # not claimable: the wake-up was only a hint
                log.debug("dropping wake-up for %s: %s", wake.task_id, e.message)
                self.driver.ack(self.queue_name, msg.receipt)
                return
            self.driver.nack(self.queue_name, msg.receipt, f"claim failed: {e}", delay_seconds=1)
            return
        self.tasks_run += 1
        try:
            self._run_claimed(claim, msg, stop or threading.Event())
        except Exception as e:
            # The lease is ours until it expires; the reaper retries the attempt after that.
            log.exception("task %s attempt %s: wrapper error", claim.task_id, claim.attempt)
            self.host.kill()
            self.driver.nack(self.queue_name, msg.receipt, f"wrapper error: {e}", delay_seconds=1)
            return
        self.driver.ack(self.queue_name, msg.receipt)

    # -- one attempt ---------------------------------------------------------------------
    def _report(self, claim: m.Claim, outcome: str, **kw: Any) -> None:
        try:
            res = self.client.complete(claim, outcome, **kw)
            log.info("task %s attempt %s -> %s", claim.task_id, claim.attempt, res.status)
        except ApiError as e:
            log.warning("completion of %s attempt %s refused: %s", claim.task_id, claim.attempt, e)

    def _run_claimed(self, claim: m.Claim, msg: Message, stop: threading.Event) -> None:
        task = self.client.fetch(claim)
        if task.status == "canceled":
            self._report(claim, "canceled")
            return
        if task.status != "running":  # reaped between claim and fetch: not ours to run
            return
        env = {**self.task_env, **task.slot_env}
        if task.operator in TRUSTED_OPERATORS and task.runtime == "ecs_platform":
            env.update(self.trusted_env)
        if task.slot_secret_names:
            env.update(self.client.secrets(claim))
        try:
            self.host.run(task, env)
        except Exception as e:  # the host could not even start
            self._report(claim, "failed", error=f"operator host failed to start: {e}")
            return
        beat_every = max(0.2, min(claim.heartbeat_seconds, self.visibility / 3))
        next_beat = time.monotonic() + beat_every
        progress: dict[str, Any] | None = None
        while True:
            timeout = max(0.0, next_beat - time.monotonic())
            try:
                out = self.host.messages.get(timeout=timeout)
            except stdqueue.Empty:
                out = None
            if out is None or time.monotonic() >= next_beat:
                next_beat = time.monotonic() + beat_every
                try:
                    hb = self.client.heartbeat(claim, progress)
                    self.driver.extend_visibility(self.queue_name, msg.receipt, self.visibility)
                except ApiError as e:  # lease lost (reaped) or superseded: stop at once
                    log.warning(
                        "task %s attempt %s: %s; stopping operator", claim.task_id, claim.attempt, e
                    )
                    self.host.kill()
                    return
                if hb.cancel_requested or stop.is_set():
                    self.host.kill()
                    if hb.cancel_requested:
                        self._report(claim, "canceled")
                    else:
                        self._report(claim, "failed", error="worker shut down during the attempt")
                    return
            if out is None:
                continue
            kind = out.get("type")
            if kind == "progress":
                progress = out["progress"]
            elif kind == "event":
                try:
                    self.client.events(claim, [m.EventIn.model_validate(out["event"])])
                except ApiError as e:
                    log.warning("event refused for %s: %s; stopping operator", claim.task_id, e)
                    self.host.kill()
                    return
            elif kind == "done":
                finals = [m.EventIn.model_validate(e) for e in out["final_events"]]
                outputs = [m.OutputCommit.model_validate(o) for o in out.get("outputs", [])]
                self._report(
                    claim,
                    "succeeded",
                    final_events=finals,
                    outputs=outputs,
                    operator_state=out.get("state"),
                    operator_state_revision=task.operator_state_revision,
                )
                return
            elif kind == "failed":
                self._report(claim, "failed", error=out["error"], retryable=out["retryable"])
                return
            elif kind == "exit":
                code = out["returncode"]
                why = f"signal {-code}" if code < 0 else f"exit code {code}"
                tail = self.host.log_tail()
                self._report(
                    claim, "failed", error=f"operator process died ({why})\n{tail}".strip()
                )
                return
