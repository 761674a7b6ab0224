"""What a host says of its run, read into what the attempt reports to the Dispatcher: its
outcome, progress and errors, bounded and on one line where they are the operator's words."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from trace_platform.contract import (
    MAX_ERROR_CHARS,
    MAX_PROGRESS_BYTES,
    Claim,
    CompleteResponse,
    EventIn,
    OutputCommit,
    TaskPayload,
    progress_size,
)
from trace_platform.worker.attempt import LeaseClock, Running, within_lease
from trace_platform.worker.client import ApiError, DispatcherClient

log = logging.getLogger(__name__)


def gist(e: Exception) -> str:
    """An error's gist: its type, and the first line of what it says (a validation error's
    next lines repeat the operator's input)."""
    if isinstance(e, ValidationError) and e.errors():
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or e.title
        return one_line(f"{where}: {first['msg']}", 200)
    said = str(e).strip().splitlines()
    return one_line(f"{type(e).__name__}: {said[0]}", 200) if said else type(e).__name__


def one_line(text: str, limit: int) -> str:
    """`text` on one line (no newline or control character an operator put in it), cut to
    `limit` characters."""
    return " ".join("".join(c if c.isprintable() else " " for c in text[: 4 * limit]).split())[
        :limit
    ]


# What a host says of its run, each tagged with the run (`Running.label`) it belongs to.
RUN_MESSAGES = frozenset({"done", "failed", "event", "buffer", "progress", "store"})


def foreign(out: dict[str, Any], run: Running) -> str | None:
    """Why a host's message is not `run`'s (None: it is, or is not a run's message). One
    tagged with another run comes from what an earlier task left running in the host: it
    must not end, or speak for, the attempt that runs now."""
    kind = out.get("type")
    if kind not in RUN_MESSAGES or out.get("run") == run.label:
        return None
    said = out.get("run")
    if said is None:
        whose = "no run"
    elif isinstance(said, str):
        whose = f"run {one_line(said, 80)!r}"
    else:  # never str() of whatever the host sent (nested deep, it would recurse)
        whose = f"a run named by a JSON {type(said).__name__}"
    return f"a {kind!r} message for {whose} during run {run.label!r}"


def clean_report(kw: dict[str, Any]) -> dict[str, Any]:
    """A report's arguments as the API takes them: operator text has no NULs (Postgres
    refuses them)."""
    if isinstance(kw.get("error"), str):
        error = kw["error"].replace("\x00", "\\0")
        if len(error) > MAX_ERROR_CHARS:
            cut = f"\n... ({len(error) - MAX_ERROR_CHARS + 100:,} more characters cut)"
            error = error[: MAX_ERROR_CHARS - 100] + cut
        return {**kw, "error": error}
    return kw


def reported(claim: Claim, res: CompleteResponse) -> None:
    # A success at debug: the Dispatcher records every outcome, and a log line per task was
    # about a tenth of the worker's CPU on short tasks.
    level = logging.DEBUG if res.status == "succeeded" else logging.INFO
    log.log(level, "task %s attempt %s -> %s", claim.task_id, claim.attempt, res.status)


def refused_report(claim: Claim, outcome: str, e: ApiError | ValueError) -> dict[str, Any] | None:
    """A completion refused, by the API (ApiError) or the client's own validation
    (ValueError: too many events): what the attempt reports instead, if anything. What a
    success produced was refused (not its own dataset, malformed): the attempt fails now,
    naming why, instead of waiting for its lease to expire."""
    if isinstance(e, ApiError):
        log.warning("completion of %s attempt %s refused: %s", claim.task_id, claim.attempt, e)
        if outcome == "succeeded" and e.status in (403, 413, 422):
            return {"error": f"completion refused: {e.message}", "retryable": False}
        return None
    log.warning("completion of %s attempt %s invalid: %s", claim.task_id, claim.attempt, e)
    if outcome == "succeeded":
        return {"error": f"completion invalid: {e}", "retryable": False}
    return None


def send_report(
    client: DispatcherClient,
    claim: Claim,
    outcome: str,
    clock: LeaseClock | None = None,
    **kw: Any,
) -> None:
    """The attempt's report (attempt-fenced), tried again while the API is away and `clock`
    runs; a refused one followed by the failure `refused_report` says (the worker wrapper's and
    the Lambda invoker's)."""
    kw = clean_report(kw)
    try:
        res = within_lease(clock, "completion", lambda: client.complete(claim, outcome, **kw))
    except (ApiError, ValueError) as e:
        follow = refused_report(claim, outcome, e)
        if follow is not None:
            send_report(client, claim, "failed", **follow)
        return
    reported(claim, res)


def final_report(out: dict[str, Any], task: TaskPayload) -> tuple[str, dict[str, Any]]:
    """The outcome and report of a host's `done` or `failed` message."""
    if out["type"] == "done":
        if not isinstance(out["final_events"], list) or not isinstance(
            out.get("outputs", []), list
        ):
            raise TypeError("final_events and outputs are lists")
        if not isinstance(out.get("state"), dict | None):
            raise TypeError("state is an object or null")
        return "succeeded", {
            "final_events": [EventIn.model_validate(e) for e in out["final_events"]],
            "outputs": [OutputCommit.model_validate(o) for o in out.get("outputs", [])],
            "operator_state": out.get("state"),
            "operator_state_revision": task.operator_state_revision,
        }
    error, retryable = out["error"], out["retryable"]
    if not isinstance(error, str) or not isinstance(retryable, bool):
        raise TypeError("a failure's error is text and its retryable a boolean")
    return "failed", {"error": error, "retryable": retryable}


def exit_reason(code: int | None) -> str:
    """How a host ended, from its `exit` message (no code: it closed its output, ran on)."""
    if code is None:
        return "it closed its output and was killed"
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def bounded_progress(reported: Any, claim: Claim) -> dict[str, Any] | None:
    """An operator's progress report as the heartbeat may carry it: a JSON object within
    MAX_PROGRESS_BYTES (a heartbeat refused for it would cost the task its lease): a larger one
    is replaced by a note saying so, anything but an object is ignored."""
    if not isinstance(reported, dict):
        return None
    try:
        size = progress_size(reported)
    except (TypeError, ValueError, RecursionError):
        size = MAX_PROGRESS_BYTES + 1
    if size > MAX_PROGRESS_BYTES:
        log.warning(
            "task %s attempt %s: progress report dropped (over %d bytes of JSON)",
            claim.task_id,
            claim.attempt,
            MAX_PROGRESS_BYTES,
        )
        return {"dropped": f"report over {MAX_PROGRESS_BYTES} bytes"}
    return reported
