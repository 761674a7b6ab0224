from __future__ import annotations

import json
import uuid

import pytest

from trace_platform.queue import payloads


def test_encode_known_kinds() -> None:
    t = str(uuid.uuid4())
    assert json.loads(payloads.encode({"kind": "task_wakeup", "task_id": t})) == {
        "kind": "task_wakeup",
        "task_id": t,
    }
    assert payloads.encode(payloads.Delivery(delivery_id=uuid.UUID(t))) == json.dumps(
        {"kind": "delivery", "delivery_id": t}, separators=(",", ":")
    )
    rec = {"kind": "buffer_record", "dataset_uuid": t, "record_id": t}
    assert isinstance(payloads.decode(payloads.encode(rec)), payloads.BufferRecord)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kind": "nope"}, "kind"),
        ({"task_id": str(uuid.uuid4())}, "kind"),
        ({"kind": "task_wakeup", "task_id": "x"}, "task_id"),
        ({"kind": "delivery", "delivery_id": str(uuid.uuid4()), "x": 1}, "x"),
        ("[1,", "not valid JSON"),
    ],
)
def test_bad_payloads_name_the_problem(raw: object, message: str) -> None:
    with pytest.raises(payloads.PayloadError, match=message):
        payloads.encode(raw)


def test_size_limit() -> None:
    big = {"kind": "task_wakeup", "task_id": str(uuid.uuid4()), "pad": "x" * 300_000}
    with pytest.raises(payloads.PayloadError, match="under 262144 bytes"):
        payloads.encode(big)


def test_wakeups_and_lease_refs_of_older_versions_still_read() -> None:
    """start_day is no longer sent (the status row has it), but a wake-up still queued by an
    older version, or an older worker's claim and lease reference, still reads."""
    from trace_platform.contract import ClaimRequest, LeaseRef

    task = uuid.uuid4()
    old = payloads.decode(json.dumps({"kind": "task_wakeup", "task_id": str(task), "start_day": 9}))
    assert isinstance(old, payloads.TaskWakeup) and old.task_id == task
    assert json.loads(payloads.encode(payloads.TaskWakeup(task_id=task))) == {
        "kind": "task_wakeup",
        "task_id": str(task),
    }
    ClaimRequest(task_id=task, worker_id="w", start_day=9)
    LeaseRef(task_id=task, attempt=1, lease_token=uuid.uuid4(), start_day=9)


def test_every_kind_of_input_is_sized_as_encoded() -> None:
    """A model's fields are unbounded (an integer's digits): its JSON is sized too, so pgqueue
    refuses what SQS would; JSON text is sized before it is parsed."""
    over = payloads.MAX_PAYLOAD_BYTES + 1
    model = payloads.TaskWakeup(task_id=uuid.uuid4(), start_day=10**over)
    with pytest.raises(payloads.PayloadError, match=r"payload is \d+ bytes"):
        payloads.encode(model)
    with pytest.raises(payloads.PayloadError, match=r"payload is \d+ bytes"):
        payloads.encode(" " * over + "{}")
    digits = {"kind": "task_wakeup", "task_id": str(uuid.uuid4()), "start_day": 10**5000}
    with pytest.raises(payloads.PayloadError, match="cannot be encoded"):
        payloads.encode(digits)
