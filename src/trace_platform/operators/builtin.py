"""Simple platform operators, used by tests and the demo."""

from __future__ import annotations

import os
import signal
import time
import uuid

from trace_platform.dispatcher.models import EventIn
from trace_platform.operators.context import OperatorContext, OperatorError, PermanentError


def noop(ctx: OperatorContext) -> None:
    """config: record_to (a file path: appends "task_id attempt", so a run can be counted) and
    record_env (env var names whose values are appended too: shows what a slot injected)."""
    ctx.log.info("noop task %s attempt %s", ctx.task.task_id, ctx.task.attempt)
    if path := ctx.config.get("record_to"):
        env = " ".join(f"{k}={os.environ.get(k, '')}" for k in ctx.config.get("record_env", []))
        with open(path, "a") as f:
            f.write(f"{ctx.task.task_id} {ctx.task.attempt} {env}".rstrip() + "\n")


def sleep(ctx: OperatorContext) -> None:
    """config: seconds (float), step (float, progress granularity)."""
    seconds = float(ctx.config.get("seconds", 1.0))
    step = float(ctx.config.get("step", 0.1))
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(step, left))
        ctx.progress(done=round(1 - max(0.0, end - time.monotonic()) / seconds, 3))


def fail(ctx: OperatorContext) -> None:
    """config: message, permanent (bool), succeed_on_attempt (int: fail before it, then succeed)."""
    succeed_on = ctx.config.get("succeed_on_attempt")
    if succeed_on is not None and ctx.task.attempt >= int(succeed_on):
        return
    message = str(ctx.config.get("message", "asked to fail"))
    if ctx.config.get("permanent"):
        raise PermanentError(message)
    raise OperatorError(message)


def crash(ctx: OperatorContext) -> None:
    """Kills its own process, as a segfaulting native library would."""
    os.kill(os.getpid(), signal.SIGKILL)


def emit_events(ctx: OperatorContext) -> list[EventIn]:
    """config: dataset_uuid (default: the task's first output), count, final (how many of them are
    bundled with the completion instead of sent mid-task), sleep between events."""
    default = (
        ctx.task.outputs[0].dataset_uuid
        if ctx.task.outputs
        else uuid.uuid5(uuid.NAMESPACE_URL, ctx.task.job)
    )
    dataset = uuid.UUID(str(ctx.config.get("dataset_uuid") or default))
    count = int(ctx.config.get("count", 3))
    final = int(ctx.config.get("final", 1))
    pause = float(ctx.config.get("sleep", 0))
    events = [EventIn(dataset_uuid=dataset, cursor=str(i), payload={"n": i}) for i in range(count)]
    for ev in events[: count - final]:
        ctx.emit(ev)
        time.sleep(pause)
    return events[count - final :]
