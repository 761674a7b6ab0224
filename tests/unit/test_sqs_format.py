"""The sqs driver's pure parts: queue names, receipts, whole seconds, batches."""

from __future__ import annotations

import pytest

from trace_platform.queue.sqs_format import (
    BATCH,
    DLQ_SUFFIX,
    NAME_MAX,
    attribute_text,
    body_batches,
    physical_name,
    queue_name_of_url,
    receipt,
    split_receipt,
    whole_seconds,
)


def test_names_map_one_to_one_and_never_onto_a_dead_letter_queue() -> None:
    names = ["tasks", "buffer.ab12", "buffer-2eab12", "buffer_2eab12", "a-dlq", "a.dlq", "ü", "a b"]
    physical = [physical_name("trace-", n) for n in names]
    assert physical[:2] == ["trace-tasks", "trace-buffer-2eab12"]
    assert physical[6] == "trace--c3-bc"  # one escape per UTF-8 byte
    assert len(set(physical)) == len(names)
    assert not any(p.endswith(DLQ_SUFFIX) for p in physical)
    assert all(p.replace("-", "").replace("_", "").isalnum() for p in physical)


def test_a_name_too_long_for_sqs_is_refused_with_the_prefix_to_blame() -> None:
    fits = "x" * (NAME_MAX - len(DLQ_SUFFIX) - len("trace-"))
    assert physical_name("trace-", fits)
    with pytest.raises(ValueError, match="TRACE_SQS_QUEUE_PREFIX"):
        physical_name("trace-", fits + "x")
    with pytest.raises(ValueError, match="not a queue name"):
        physical_name("trace-", "")


def test_receipts_round_trip_and_others_are_refused() -> None:
    r = receipt("trace-tasks", 3, "AQEB/x+y==")
    assert split_receipt(r) == ("trace-tasks", 3, "AQEB/x+y==")
    for bad in ["", "garbage", "12:3f2a-uuid", "q:x:handle", "q:1:", "q:1:has space", None, 7]:
        with pytest.raises(ValueError, match="not an sqs receipt"):
            split_receipt(bad)


def test_urls_name_standard_queues_only() -> None:
    assert (
        queue_name_of_url("https://sqs.eu-west-1.amazonaws.com/1234/trace-tasks") == "trace-tasks"
    )
    with pytest.raises(ValueError, match="standard SQS queue"):
        queue_name_of_url("https://sqs.eu-west-1.amazonaws.com/1234/tasks.fifo")


def test_seconds_are_whole_and_bounded() -> None:
    assert [whole_seconds(s, 20) for s in (0, 0.01, 0.5, 1, 1.2, 25, -3)] == [0, 1, 1, 1, 2, 20, 0]


def test_batches_hold_ten_and_at_most_the_byte_limit() -> None:
    assert [len(b) for b in body_batches(["x"] * 25)] == [BATCH, BATCH, 5]
    big = ["é" * 50_000] * 5  # 100,000 bytes each: two fit under 256 KiB, not three
    assert [len(b) for b in body_batches(big)] == [2, 2, 1]


def test_attribute_text_is_what_sqs_accepts() -> None:
    assert attribute_text("boom\x00\x07 ok\n") == "boom?? ok\n"
    assert attribute_text("") == "-"
    assert len(attribute_text("x" * 10_000)) == 4000
