"""EventBridge schedules -> a DAG's cron trigger, fired as the Lite scheduler fires it.

Deploy as the handler `trace_platform.aws.eventbridge.handler` (docs/aws-entry.md). The event
is the input shape below: an EventBridge Scheduler schedule's target input (the scheduled time
from its `<aws.scheduler.scheduled-time>` context attribute), or an EventBridge rule's
Scheduled Event reshaped by the target's input transformer (`time` -> `scheduled_time`).

    {"org": "acme", "dag": "nightly", "trigger": "daily",
     "scheduled_time": "2024-05-01T02:00:00Z",
     "config": {...},          # optional, merged over the trigger's config
     "schedule": "arn:..."}    # optional, the schedule's or rule's ARN, for the log

The DAG declares the trigger as it does in Lite (`triggers.cron`, with its schedule): the time
must be a tick of that schedule, and each (trigger, tick) starts one run however often
EventBridge delivers it (triggers/cron.py `fire_scheduled`). A malformed or unknown input raises
a TraceError naming the problem, with nothing stored."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trace_platform import audit
from trace_platform.aws import container
from trace_platform.dag.schema import NAME_RE
from trace_platform.errors import Invalid
from trace_platform.triggers.cron import fire_scheduled

log = logging.getLogger(__name__)


class ScheduledInput(BaseModel):
    """What a schedule's target passes (the input transformer makes it of a rule's event)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    org: str = Field(min_length=1, max_length=200, description="the org's name")
    dag: str = Field(pattern=NAME_RE, description="the DAG's name in the org")
    trigger: str = Field(pattern=NAME_RE, description="a cron trigger the DAG declares")
    scheduled_time: str = Field(
        max_length=64, description="ISO 8601 with its zone: <aws.scheduler.scheduled-time>"
    )
    config: dict[str, Any] = Field(default_factory=dict, description="merged over the trigger's")
    schedule: str | None = Field(default=None, max_length=2048, description="ARN, for the log")


def handler(event: Any, context: Any) -> dict[str, Any]:
    """Fires the tick the event names; returns the run (`run_id`, `created`, `tasks`), or why
    none was made (`skipped`: the DAG is paused, the trigger already fired past this tick)."""
    given = parse(event)
    at = scheduled_time(given.scheduled_time)
    with audit.via("eventbridge", getattr(context, "aws_request_id", None)):
        out = fire_scheduled(
            container.services().dispatcher,
            org=given.org,
            dag=given.dag,
            trigger=given.trigger,
            at=at,
            config=given.config,
        )
    log.info(
        "schedule %s: %s/%s/%s at %s -> %s",
        given.schedule or "-",
        given.org,
        given.dag,
        given.trigger,
        given.scheduled_time,
        out,
    )
    # Lambda returns JSON: ids as text.
    return {
        **out,
        "run_id": None if out["run_id"] is None else str(out["run_id"]),
        "tasks": [str(t) for t in out["tasks"]],
    }


def parse(event: Any) -> ScheduledInput:
    """The input, or Invalid naming what is wrong with the event."""
    if not isinstance(event, dict):
        raise Invalid(
            f"the event is a JSON {type(event).__name__}, not the schedule input object "
            "{org, dag, trigger, scheduled_time}"
        )
    if "detail-type" in event:  # an event as a rule passes it when the target has no input
        raise Invalid(
            f"an EventBridge event ({event.get('detail-type')!r} from {event.get('source')!r}) "
            "names no DAG: give the rule's target the input transformer of docs/aws-entry.md, "
            "which passes {org, dag, trigger, scheduled_time: <time>}"
        )
    try:
        return ScheduledInput.model_validate(event)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'input'}: {err['msg']}"
            for err in e.errors()[:20]
        )
        raise Invalid(f"the schedule input is malformed: {problems}") from None


def scheduled_time(text: str) -> datetime:
    """The scheduled time, refused unless ISO 8601 with a zone (EventBridge's are UTC, `Z`)."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        hint = (
            " (only EventBridge Scheduler fills in its context attributes: a rule's target "
            "takes `time` through an input transformer)"
            if text.startswith("<aws.")
            else ""
        )
        raise Invalid(f"scheduled_time {text!r} is not an ISO 8601 time{hint}") from None
    if at.tzinfo is None:
        raise Invalid(f"scheduled_time {text!r} has no time zone (EventBridge's end in Z)")
    return at
