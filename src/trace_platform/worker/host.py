"""The operator host: a child process that runs operators, one task at a time.

It holds no lease token and no internal credential (its environment is scrubbed), so operator
code cannot reach /internal/*. It speaks JSON lines: tasks in on stdin, messages out on the
original stdout; operator prints and logs go to the log file that stdout/stderr now point at.
Long-lived, so expensive state (a SparkSession) survives between tasks.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from trace_platform.dispatcher.models import TaskPayload
from trace_platform.operators import OperatorContext, OperatorResult, resolve
from trace_platform.spark import drop_temp_views

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


@contextlib.contextmanager
def _task_env(env: dict[str, str]) -> Iterator[None]:
    """The slot's env vars exist only while its task runs."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_one(
    task: TaskPayload, send: Any, workroot: Path, env: dict[str, str] | None = None
) -> None:
    workdir = workroot / str(task.task_id) / str(task.attempt)
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = OperatorContext(task=task, workdir=workdir, _send=send)
    with _task_env(env or {}):
        try:
            _run(ctx, task, send)
        finally:
            drop_temp_views()


def _run(ctx: OperatorContext, task: TaskPayload, send: Any) -> None:
    try:
        fn = resolve(task.operator)
        result = fn(ctx)
        if not isinstance(result, OperatorResult):
            result = OperatorResult(events=list(result or []))
        send(
            {
                "type": "done",
                "final_events": [e.model_dump(mode="json") for e in result.events],
                "outputs": [o.model_dump(mode="json") for o in result.outputs],
                "state": result.state,
            }
        )
    except Exception as exc:
        logging.getLogger("trace.operator").exception("operator %s failed", task.operator)
        send(
            {
                "type": "failed",
                "error": _error_text(exc),
                "retryable": getattr(exc, "retryable", True),
            }
        )


def main() -> None:
    _die_with_parent()
    proto: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    log_path = os.environ.get("TRACE_HOST_LOG")
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    workroot = Path(os.environ.get("TRACE_HOST_WORKDIR") or tempfile.mkdtemp(prefix="trace-op-"))

    def send(msg: dict[str, Any]) -> None:
        proto.write(json.dumps(msg, default=str) + "\n")

    send({"type": "ready", "pid": os.getpid()})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("type") == "run":
            run_one(TaskPayload.model_validate(msg["task"]), send, workroot, msg.get("env"))


if __name__ == "__main__":
    main()
