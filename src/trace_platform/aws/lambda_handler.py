"""The handler of the `lambda` runtime, the function a user deploys
(`trace_platform.aws.lambda_handler.handler`, docs/lambda.md).

The Lambda invoker (aws/lambda_runner.py) claims a lambda task as a platform worker does and
invokes the function with a `LambdaEvent`: the task's payload as the claim read it (its attempt,
and the outputs the Dispatcher assigned it) and its slot's environment. No lease token and no
credential of the platform is in it: the handler cannot speak to the Dispatcher. It runs the
operator by the operator host's own code path (`host_main.run_operator`) and returns a
`LambdaResult`: its outcome, the events it emitted on the way and at its end, the output pieces
it committed, the buffer batches it wrote, its new state. The invoker takes that as a claim,
not a fact: it validates it, and reports it through the same attempt-fenced calls as a worker.

The operator's store is the function's own (its environment: TRACE_OBJECT_STORE=s3,
TRACE_S3_BUCKET, the IAM role's credentials), held to the task's scope (aws/task_store.py); in
Lite's local invoker it is the invoker's store proxy instead (aws/lambda_local.py)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trace_platform.contract import (
    MAX_ERROR_CHARS,
    MAX_EVENTS_PER_CALL,
    BufferPublishBody,
    EventIn,
    OutputCommit,
    TaskPayload,
)
from trace_platform.objectstore import ObjectStore
from trace_platform.operators import OperatorContext

# The event's shape; a handler refuses any other (an invoker of another Trace version).
PROTOCOL = 1
# Lambda's own limit on a synchronous invocation's request and response payloads.
MAX_PAYLOAD_BYTES = 6 * 1024 * 1024


class LambdaEvent(BaseModel):
    """What the invoker sends the function."""

    model_config = ConfigDict(extra="forbid")

    trace_lambda: Literal[1] = PROTOCOL
    task: TaskPayload
    env: dict[str, str] = Field(default_factory=dict)  # the slot's env and secrets


class LambdaResult(BaseModel):
    """What the function answers: the invoker validates it as an untrusted claim."""

    model_config = ConfigDict(extra="forbid")

    outcome: Literal["succeeded", "failed"]
    events: list[EventIn] = Field(default_factory=list, max_length=MAX_EVENTS_PER_CALL)
    final_events: list[EventIn] = Field(default_factory=list, max_length=MAX_EVENTS_PER_CALL)
    outputs: list[OutputCommit] = Field(default_factory=list, max_length=MAX_EVENTS_PER_CALL)
    buffers: list[BufferPublishBody] = Field(default_factory=list, max_length=MAX_EVENTS_PER_CALL)
    state: dict[str, Any] | None = None
    error: str | None = Field(default=None, max_length=MAX_ERROR_CHARS)
    retryable: bool = True


StoreFor = Callable[[TaskPayload, Path], ObjectStore]


class _Said:
    """What the operator sends mid-run: events and buffer batches, kept for the result
    (progress has no one to go to during a synchronous invocation)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.buffers: list[dict[str, Any]] = []

    def __call__(self, msg: dict[str, Any]) -> None:
        if msg.get("type") == "event":
            self.events.append(msg["event"])
        elif msg.get("type") == "buffer":
            self.buffers.append(msg["buffer"])


def run_event(event: Any, store_for: StoreFor, workdir: Path) -> dict[str, Any]:
    """One invocation: `event` (a LambdaEvent's JSON value) run in `workdir` with the store
    `store_for` makes for its task; the LambdaResult's JSON value."""
    from trace_platform.worker.host_main import run_operator
    from trace_platform.worker.reports import gist

    try:
        ev = LambdaEvent.model_validate(event)
    except ValidationError as e:
        return {
            "outcome": "failed",
            "error": f"not a Trace task event: {gist(e)}",
            "retryable": False,
        }
    said = _Said()
    ctx = OperatorContext(
        task=ev.task, workdir=workdir, _send=said, env=ev.env, _store=store_for(ev.task, workdir)
    )
    home = Path.cwd()
    os.chdir(workdir)
    try:
        out = run_operator(ctx, ev.task)
    finally:
        ctx.close()
        os.chdir(home)
    common = {"events": said.events, "buffers": said.buffers}
    if out["type"] == "done":
        return {
            "outcome": "succeeded",
            "final_events": out["final_events"],
            "outputs": out["outputs"],
            "state": out["state"],
            **common,
        }
    return {"outcome": "failed", "error": out["error"], "retryable": out["retryable"], **common}


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Lambda's entry point. The store is built from the function's environment on each
    invocation (cheap: a client, no connection) and scoped to the task; the operator works in
    a fresh directory under /tmp, removed after it."""
    from trace_platform.aws.task_store import TaskStore
    from trace_platform.config import get_settings
    from trace_platform.objectstore import make_store

    store = make_store(get_settings())
    with tempfile.TemporaryDirectory(prefix="trace-task-") as work:
        return run_event(event, lambda task, wd: TaskStore(store, task, wd), Path(work))
