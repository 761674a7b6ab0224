"""The typed, small queue payloads. Queue messages are wake-ups, never task data."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

# Every driver's limit, so Lite cannot drift from AWS: SQS's until 2025 (it now takes 1 MiB;
# the sqs driver sets its queues to this).
MAX_PAYLOAD_BYTES = 256 * 1024


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskWakeup(_Payload):
    kind: Literal["task_wakeup"] = "task_wakeup"
    task_id: UUID
    # Accepted from wake-ups queued by older versions, never sent: the Dispatcher finds a task
    # by task_id in task_status (hash-partitioned by it), whose start_day prunes the registry.
    start_day: int | None = None


class BufferRecord(_Payload):
    kind: Literal["buffer_record"] = "buffer_record"
    dataset_uuid: UUID
    record_id: UUID


class Delivery(_Payload):
    kind: Literal["delivery"] = "delivery"
    delivery_id: UUID


Payload = Annotated[TaskWakeup | BufferRecord | Delivery, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[TaskWakeup | BufferRecord | Delivery] = TypeAdapter(Payload)


class PayloadError(ValueError):
    """A payload that is not one of the known kinds, or too large for a queue message."""


def encode(payload: Any) -> str:
    """Validates a payload (model, dict or JSON text) and returns its compact JSON, refused
    when that JSON (what every driver sends) is over MAX_PAYLOAD_BYTES."""
    if isinstance(payload, str):
        _check_size(len(payload.encode()))  # before parsing it
        try:
            payload = json.loads(payload)
        except json.JSONDecodeError as e:
            raise PayloadError(f"queue payload is not valid JSON: {e}") from None
    if isinstance(payload, TaskWakeup | BufferRecord | Delivery):
        model = payload
    else:
        try:
            # A dict sized before validating it; json.dumps' ValueError: an integer of more
            # digits than Python converts.
            _check_size(len(json.dumps(payload, separators=(",", ":"), default=str)))
        except ValueError as e:
            if isinstance(e, PayloadError):
                raise
            raise PayloadError(f"queue payload cannot be encoded: {e}") from None
        try:
            model = _ADAPTER.validate_python(payload)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "payload"
            raise PayloadError(f"invalid queue payload at {where}: {first['msg']}") from None
    body = model.model_dump_json(exclude_none=True)
    _check_size(len(body.encode()))  # a model's fields (an integer's digits) are unbounded
    return body


def _check_size(n: int) -> None:
    if n > MAX_PAYLOAD_BYTES:
        raise PayloadError(
            f"queue payload is {n} bytes; messages must stay under "
            f"{MAX_PAYLOAD_BYTES} bytes (send a pointer to the data, not the data)"
        )


def decode(raw: str | bytes | dict[str, Any]) -> TaskWakeup | BufferRecord | Delivery:
    try:
        if isinstance(raw, dict):
            return _ADAPTER.validate_python(raw)
        return _ADAPTER.validate_json(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "payload"
        raise PayloadError(f"invalid queue payload at {where}: {first['msg']}") from None
