"""The SQS driver's pure parts (no boto3 here): queue names, receipts, SQS's limits, batches.

Everything here is checked before a request is made, so a bad name or receipt fails the same
way with or without a reachable SQS endpoint.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from typing import TypeVar

from trace_platform.queue.payloads import MAX_PAYLOAD_BYTES

T = TypeVar("T")

BATCH = 10  # entries per SendMessageBatch / DeleteMessageBatch / ReceiveMessage call
MAX_WAIT = 20  # seconds: ReceiveMessage's longest WaitTimeSeconds
MAX_DELAY = 900  # seconds: SendMessage's longest DelaySeconds (a longer delay hops: sqs.py)
MAX_VISIBILITY = 43200  # seconds: 12 hours, the longest a message stays invisible
NAME_MAX = 80  # characters of an SQS queue name
DLQ_SUFFIX = "-dlq"
# Trace's limit (payloads.MAX_PAYLOAD_BYTES, which pgqueue enforces too): SQS allowed 256 KiB
# until 2025 and now allows 1 MiB per message and per batch, so a queue the driver creates is
# set to 256 KiB (MaximumMessageSize) and a batch is cut at 256 KiB of bodies: both fit either.
MAX_MESSAGE_BYTES = MAX_PAYLOAD_BYTES
PREFIX = re.compile(r"[A-Za-z0-9_-]{0,40}")
_PHYSICAL = r"[A-Za-z0-9_-]{1,80}"
_KEEP = re.compile(r"[A-Za-z0-9_]")
_RECEIPT = re.compile(rf"({_PHYSICAL}):([0-9]{{1,9}}):(\S{{1,1024}})")


def physical_name(prefix: str, queue_name: str) -> str:
    """The SQS queue of a Trace queue: `prefix` then the name, each character SQS refuses in a
    name (anything but letters, digits and '_') written as '-' and two hex digits per UTF-8
    byte ("buffer.ab12" -> "buffer-2eab12"). A '-' only starts an escape, so two names never
    share a queue; and an escape's digits are hex, so no name ends in "-dlq" and takes
    another's dead-letter queue."""
    if not isinstance(queue_name, str) or not queue_name:
        raise ValueError(f"not a queue name: {queue_name!r}")
    escaped = "".join(
        c if _KEEP.fullmatch(c) else "".join(f"-{b:02x}" for b in c.encode()) for c in queue_name
    )
    name = prefix + escaped
    if len(name) + len(DLQ_SUFFIX) > NAME_MAX:
        raise ValueError(
            f"queue {queue_name!r} would be the SQS queue {name!r} ({len(name)} characters); "
            f"SQS names have at most {NAME_MAX}, {NAME_MAX - len(DLQ_SUFFIX)} with the "
            f"dead-letter suffix {DLQ_SUFFIX!r}: use a shorter TRACE_SQS_QUEUE_PREFIX"
        )
    return name


def queue_name_of_url(url: str) -> str:
    """The queue name an SQS queue URL ends with (standard queues only: a FIFO queue's
    ".fifo" name is refused, as its ordering and deduplication are not what Trace asks for)."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    if not re.fullmatch(_PHYSICAL, name):
        raise ValueError(f"not the URL of a standard SQS queue: {url!r}")
    return name


def receipt(physical: str, delivery_count: int, handle: str) -> str:
    """A driver receipt: the SQS queue it came from (so it settles only there), the delivery
    count (so a nack knows a final delivery) and SQS's receipt handle."""
    return f"{physical}:{delivery_count}:{handle}"


def split_receipt(value: object) -> tuple[str, int, str]:
    """(SQS queue name, delivery count, receipt handle) of a receipt; ValueError if it is
    not one this driver issued."""
    m = _RECEIPT.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"not an sqs receipt: {value!r}")
    return m[1], int(m[2]), m[3]


def whole_seconds(seconds: float, top: int) -> int:
    """SQS counts visibility, delay and waits in whole seconds: a fraction is rounded up (a
    0.5 s lease is a 1 s one), within [0, top]."""
    return min(top, max(0, math.ceil(seconds)))


def batches(items: Sequence[T], size: int = BATCH) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def body_batches(bodies: Sequence[str], max_bytes: int = MAX_MESSAGE_BYTES) -> Iterator[list[str]]:
    """Bodies in SendMessageBatch calls: at most BATCH each and `max_bytes` of bodies together
    (each body alone was checked against the limit before)."""
    chunk: list[str] = []
    size = 0
    for body in bodies:
        n = len(body.encode())
        if chunk and (len(chunk) == BATCH or size + n > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(body)
        size += n
    if chunk:
        yield chunk


# XML 1.0's characters, which SQS allows in bodies and string attributes (InvalidMessageContents
# otherwise); an error text may hold anything an exception said.
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def attribute_text(text: str, limit: int = 4000) -> str:
    """`text` as an SQS string attribute value: XML characters only, at most `limit`, never
    empty (SQS refuses an empty value)."""
    return _NOT_XML.sub("?", text[:limit]) or "-"
