"""What an operator host says at its end, as the worker takes it: anything the protocol does
not carry is refused by name (the attempt then fails at once, see tests/chaos/test_sandbox.py),
and what the worker reports from it is what the API takes."""

from __future__ import annotations

import socket
import uuid
from typing import Any

import pytest

from tests.unit.test_progress import CLAIM
from trace_platform.contract import MAX_ERROR_CHARS, Claim, EventIn, TaskPayload
from trace_platform.worker.client import DispatcherClient, complete_item
from trace_platform.worker.host_main import _retryable
from trace_platform.worker.reports import clean_report, final_report
from trace_platform.worker.reports import one_line as _one_line


def _claim() -> Claim:
    return CLAIM.model_copy(update={"task_id": uuid.uuid4()})


def _task() -> TaskPayload:
    """All `final_report` reads of the task (its state's revision)."""
    return TaskPayload.model_construct(operator_state_revision=0)


@pytest.mark.parametrize(
    "message",
    [
        {"type": "done"},
        {"type": "done", "final_events": "not a list"},
        {"type": "done", "final_events": [], "outputs": {"not": "a list"}},
        {"type": "done", "final_events": [], "state": [1]},
        {"type": "done", "final_events": [7]},
        {"type": "failed", "retryable": True},
        {"type": "failed", "error": ["x"], "retryable": True},
        {"type": "failed", "error": "x", "retryable": 1},
    ],
)
def test_an_end_the_protocol_does_not_carry_is_refused(message: dict[str, Any]) -> None:
    with pytest.raises((KeyError, TypeError, ValueError)):
        final_report(message, _task())


def test_a_well_formed_end_is_taken() -> None:
    task = _task()
    outcome, kw = final_report({"type": "done", "final_events": [], "state": {"n": 1}}, task)
    assert outcome == "succeeded" and kw["operator_state"] == {"n": 1}
    assert final_report({"type": "failed", "error": "boom", "retryable": False}, task) == (
        "failed",
        {"error": "boom", "retryable": False},
    )


def test_a_failures_retryable_goes_as_a_boolean() -> None:
    """An operator's exception may say `retryable = 0` (or None): the host sends a boolean,
    so its real error is reported, not a protocol break."""

    class Flagged(Exception):
        pass

    for said, sent in [(True, True), (False, False), (1, True), (0, False), (None, True)]:
        e = Flagged()
        e.retryable = said  # type: ignore[attr-defined]
        assert _retryable(e) is sent
    assert _retryable(RuntimeError()) is True


def test_a_failures_text_is_cut_to_what_the_api_takes() -> None:
    kw = clean_report({"error": "x" * 50_000, "retryable": False})
    assert len(kw["error"]) <= MAX_ERROR_CHARS and "more characters cut" in kw["error"]
    complete_item(_claim(), "failed", **kw)  # the contract takes it
    assert clean_report({"error": "a\x00b"})["error"] == "a\\0b"


def test_a_reason_in_an_operators_words_is_one_bounded_line() -> None:
    assert _one_line("a\nb\r\n\x1b[31mc\tdone", 100) == "a b [31mc done"
    assert len(_one_line("x" * 1000, 300)) == 300


def test_a_report_that_cannot_be_serialized_is_its_own_answer() -> None:
    """Nested deeper than the serializer goes, it fails alone: the exchange's other items are
    still sent (here to an address nothing listens on: each gets that failure, its own)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = DispatcherClient(f"http://127.0.0.1:{port}", retries=0, timeout=1.0)
    deep: dict[str, Any] = {}
    for _ in range(300):
        deep = {"a": deep}
    event = EventIn(dataset_uuid=uuid.uuid4(), cursor="c", payload=deep)
    first, second = _claim(), _claim()
    bad = complete_item(first, "succeeded", final_events=[event])
    try:
        answers = client.exchange([(first, bad), (second, complete_item(second, "succeeded"))])
    finally:
        client.close()
    assert isinstance(answers[0], ValueError) and "depth" in str(answers[0]), answers[0]
    assert isinstance(answers[1], Exception) and not isinstance(answers[1], ValueError)
