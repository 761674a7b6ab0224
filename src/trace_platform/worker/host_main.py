"""The operator host's child program (`python -m trace_platform.worker.host_main`, started by
`worker/operator_host.OperatorHost`): runs operators, one task at a time.

It holds no lease token, no internal credential and no store or database credentials: its
environment is built from an allowlist, and in the sandbox it runs as its own user in its own
namespaces (`trace_platform.sandbox`). It speaks JSON lines with the wrapper: tasks and store
replies in on the original stdin, messages and store requests out on the original stdout (each
moved to a descriptor of its own; fd 0 is then /dev/null); operator prints and logs go to
stderr, a log file the wrapper opened. Each message of a task names the run the
wrapper gave it (`run`: task id and attempt), so a thread a task left running cannot speak for
(nor end) the tenant's next task: the wrapper refuses it. Long-lived within one tenant (org,
DAG), so an expensive SparkSession survives between that tenant's tasks; each task gets its own
Spark session.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ValidationError

from trace_platform.contract import TaskPayload
from trace_platform.operators import Operator, OperatorContext, OperatorResult, resolve
from trace_platform.worker.store_proxy import RemoteStore

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """If the wrapper is SIGKILLed, the operator must not run on unsupervised."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _error_text(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    if type(exc).__module__.startswith(("pyspark", "py4j")):
        from trace_platform.spark import spark_error_text

        return f"Spark {type(exc).__name__}: {spark_error_text(exc)}{where}"
    return f"{type(exc).__name__}: {exc}{where}"


class Channel:
    """The wrapper link. Store calls are request/reply on the same pipes, one at a time."""

    def __init__(self, out: IO[str], inp: IO[bytes]) -> None:
        self.out = out
        self.inp = inp
        self._write = threading.Lock()
        self._call = threading.Lock()

    def send(self, msg: dict[str, Any], run: str | None = None) -> None:
        """`msg` out; `run` tags it with the run it belongs to (the wrapper refuses one that
        names another: what an earlier task left running must not speak for the next)."""
        line = json.dumps(msg if run is None else {**msg, "run": run}, default=str) + "\n"
        with self._write:
            self.out.write(line)
            self.out.flush()

    def call(self, req: dict[str, Any], run: str | None = None) -> dict[str, Any]:
        with self._call:
            self.send({"type": "store", **req}, run)
            line = self.inp.readline()
            if not line:
                raise EOFError("the wrapper closed the host's input")
            reply: dict[str, Any] = json.loads(line)
            if reply.get("type") != "store_reply":
                raise RuntimeError(f"expected a store reply, got {reply.get('type')!r}")
            return reply


def run_one(
    task: TaskPayload,
    chan: Channel,
    workdir: Path,
    env: dict[str, str],
    spark_remote: str | None = None,
    run: str | None = None,
) -> None:
    """One task, its every message tagged `run` (the wrapper's name for the attempt)."""
    home, environ = Path.cwd(), (os.environ, os.environb, environ_snapshot(os.environb))
    os.chdir(workdir)
    ctx = OperatorContext(
        task=task,
        workdir=workdir,
        _send=lambda msg: chan.send(msg, run),
        env=env,
        _store=RemoteStore(lambda req: chan.call(req, run), workdir),
        spark_remote=spark_remote,
    )
    clean = True
    try:
        outcome = run_operator(ctx, task)
    finally:
        try:
            # Before the outcome is sent: the wrapper closes the task's gateways and forwards
            # (a Spark Connect session's way out) once it has it.
            ctx.close()
        except BaseException:
            logging.getLogger("trace.operator").exception("the task's clean-up failed")
            clean = False
        os.chdir(home)
        _restore_environ(environ)
    chan.send(outcome, run)
    if not clean:
        # A host whose clean-up failed may hold what the task left (a Spark session, its
        # threads): it must not take the next task, nor linger half-alive. Exiting now makes
        # the wrapper start a fresh host for the next one.
        os._exit(70)


def environ_snapshot(environb: os._Environ[bytes]) -> dict[bytes, bytes]:
    """The variables, as bytes. Through the mapping, a copy is a Python call per key and per
    value (twice a task: 40-50 µs of a no-op task's host CPU with a dozen variables); the
    mapping's own dict (CPython's `_data`, which os.environ shares) is copied in C."""
    data = getattr(environb, "_data", None)
    return dict(data) if type(data) is dict else dict(environb)


def _restore_environ(
    saved: tuple[os._Environ[str], os._Environ[bytes], dict[bytes, bytes]],
) -> None:
    """Whatever the task set in the process environment ends with it, as its cwd does. Only
    what changed in the mapping is undone: `os.environ.clear()` pops one variable at a time,
    each pop a fresh walk (measured alone: 552 µs of host CPU per no-op task, 217-267 after)."""
    environ, environb, variables = saved
    os.environ, os.environb = environ, environb  # a task may have rebound them
    if environ_snapshot(environb) != variables:  # bytes: no decoding, os.environ's data
        for key in [k for k in environb if k not in variables]:
            del environb[key]
        for key, value in variables.items():
            if environb.get(key) != value:
                environb[key] = value
    # Under the mapping (os.putenv, a native library's setenv) too: each variable set again,
    # one C call each.
    for key, value in variables.items():
        os.putenv(key, value)


# The operators this host has run, by name: resolved once (the registry, then an import
# look-up, on every task cost more than some operators' own work).
_resolved: dict[str, Operator] = {}


def run_operator(ctx: OperatorContext, task: TaskPayload) -> dict[str, Any]:
    """The attempt's outcome message: done (with its result) or failed (the Lambda handler's
    too: trace_platform.aws.lambda_handler)."""
    try:
        fn = _resolved.get(task.operator)
        if fn is None:
            fn = _resolved[task.operator] = resolve(task.operator)
        result = fn(ctx)
        if not isinstance(result, OperatorResult):
            result = OperatorResult(events=list(result or []))
        return {
            "type": "done",
            "final_events": [e.model_dump(mode="json") for e in result.events],
            "outputs": [o.model_dump(mode="json") for o in result.outputs],
            "state": result.state,
        }
    except Exception as exc:
        logging.getLogger("trace.operator").exception("operator %s failed", task.operator)
        return {
            "type": "failed",
            "error": _error_text(exc),
            "retryable": _retryable(exc),
        }


def _retryable(exc: BaseException) -> bool:
    """An exception's `retryable` as the protocol carries it (a boolean): an int counts as
    its truth, anything else (None, a stray attribute) as the default, retryable."""
    said = getattr(exc, "retryable", True)
    return bool(said) if isinstance(said, int) else True


def main() -> None:
    _die_with_parent()
    proto: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # everything printed (Python, the JVM, Cryo) goes to the log
    sys.stdout = os.fdopen(1, "w", buffering=1)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    # The wrapper's lines on a descriptor of their own (not inherited: os.dup), as bytes,
    # whatever the locale; fd 0 is /dev/null, so an operator's input() or a process it starts
    # cannot read (or steal) protocol lines.
    wrapper: IO[bytes] = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = os.fdopen(0, "r")  # /dev/null now
    chan = Channel(proto, wrapper)
    chan.send({"type": "ready", "pid": os.getpid(), "uid": os.getuid()})
    while line := wrapper.readline():
        serve(line, chan)


class RunMessage(BaseModel):
    """A task to run, as the wrapper writes it."""

    type: Literal["run"]
    run: str | None = None
    task: TaskPayload
    env: dict[str, str] | None = None
    workdir: Path
    spark_remote: str | None = None


def serve(line: bytes, chan: Channel) -> None:
    """One line from the wrapper: a task runs; any other message is not the loop's."""
    try:
        # The line straight into the model, payload and all: one pass, no dict in between
        # (half the parse's CPU, in a host whose caches the other hosts have cooled).
        msg = RunMessage.model_validate_json(line)
    except ValidationError:
        if json.loads(line).get("type") == "run":
            raise  # a malformed task: the host ends, and the wrapper says why
        return
    run_one(msg.task, chan, msg.workdir, msg.env or {}, msg.spark_remote, msg.run)


if __name__ == "__main__":
    main()
