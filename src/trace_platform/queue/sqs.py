"""sqs: the Amazon SQS QueueDriver (the aws profile; moto or LocalStack in tests), with boto3.

Layout. A queue is a standard SQS queue (`sqs_format.physical_name`, or a URL from settings)
whose RedrivePolicy names its dead-letter queue and maxReceiveCount (queue_max_attempts).
Created on first use when `create` is on (Lite, tests), else looked up: a missing queue, or one
without a RedrivePolicy, is refused with a clear error rather than run without poison handling.

What SQS gives, and where it differs from pgqueue (the conformance suite says which guarantees
are driver-specific):
- Visibility, delays and waits are whole seconds: a fraction is rounded up. A wait is long
  polling (WaitTimeSeconds, at most 20 s a call; a longer wait is several calls).
- Delays over SQS's 900 s hop: the message carries `trace.not_before`, and a receive that finds
  it early sends it again with the rest of the delay (at most 900 s more) and deletes it.
- `delivery_count` is ApproximateReceiveCount. A receipt is "{sqs queue}:{count}:{handle}", so
  it settles only through the queue it came from, and a nack knows a final delivery.
- Receipts are not fenced. SQS accepts a DeleteMessage or ChangeMessageVisibility with a
  receipt handle that an older receive got, or of a message already deleted (AWS documents
  that such a delete succeeds and may delete nothing; moto deletes the message): ack and
  extend say False only when SQS refuses the handle (deleted, or on AWS not in flight).
- A nack is ChangeMessageVisibility(delay). SQS has no field for an error, so the error of a
  nack that leaves deliveries goes to this module's log (INFO); a nack of the final delivery
  copies the message into the DLQ itself with `trace.error`, `trace.attempts`, `trace.queue`
  and `trace.created` attributes, then deletes it. A message whose final lease just ran out
  (a crashed consumer), or whose final nack came from a process that did not receive it, is
  moved by SQS's redrive on a later receive and has no error recorded.
- `dead_letters` reads the DLQ without consuming it: each message is received with a short
  hold (DLQ_HOLD) and made visible again once listed, so it stays for inspection or a redrive.
  A DLQ has no redrive policy, so these reads only raise its ApproximateReceiveCount; two
  listings at once each see only what the other does not hold.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from trace_platform.config import Settings
from trace_platform.queue import payloads
from trace_platform.queue.driver import Message, QueueUnavailable
from trace_platform.queue.payloads import PayloadError
from trace_platform.queue.sqs_format import (
    BATCH,
    DLQ_SUFFIX,
    MAX_DELAY,
    MAX_MESSAGE_BYTES,
    MAX_VISIBILITY,
    MAX_WAIT,
    attribute_text,
    batches,
    body_batches,
    physical_name,
    queue_name_of_url,
    receipt,
    split_receipt,
    whole_seconds,
)

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

DLQ_RETENTION = 1_209_600  # 14 days, SQS's longest: dead letters wait for a person
DLQ_HOLD = 30  # seconds a listed dead letter is held before it is made visible again
BURY_HOLD = 30  # seconds a final delivery is held while it is copied into the DLQ
DEAD_LETTERS_MAX = 1000  # a listing stops here (a DLQ can be very long)
HELD_MAX = 10_000  # final deliveries' bodies kept for their nack's DLQ copy
SEND_TRIES = 3  # a batch entry SQS failed on its side is sent again this often
REDRIVEN = "visibility timeout expired on the final delivery (moved by the SQS redrive policy)"
_LOST = {"ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidReceiptHandle"}
_MISSING = {"QueueDoesNotExist", "NonExistentQueue"}
_EXISTS = {"QueueAlreadyExists", "QueueNameExists"}


class SqsError(QueueUnavailable):
    """SQS refused, failed, or lacks what the driver needs (a queue, its redrive policy)."""


def _unavailable(method: Callable[P, R]) -> Callable[P, R]:
    """The AWS SDK's errors out of a public method as SqsError (one class for a caller to
    retry); a bad payload or receipt stays PayloadError / ValueError."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except (BotoCoreError, ClientError) as e:
            raise SqsError(f"SQS {method.__name__}: {e}") from e

    return wrapper


def _codes(e: ClientError) -> set[str]:
    # SQS's JSON protocol names an error twice ("QueueDoesNotExist", and as QueryErrorCode the
    # query protocol's "AWS.SimpleQueueService.NonExistentQueue"): both, without the dots.
    error = e.response.get("Error", {})
    return {str(error.get(k, "")).rsplit(".", 1)[-1] for k in ("Code", "QueryErrorCode")}


# The queue attributes behind each state of metrics' trace_queue_messages.
_DEPTHS = {
    "ready": "ApproximateNumberOfMessages",
    "delayed": "ApproximateNumberOfMessagesDelayed",
    "leased": "ApproximateNumberOfMessagesNotVisible",
}


@dataclass(frozen=True)
class QueueRef:
    name: str  # Trace's name
    physical: str  # SQS's name (receipts carry it)
    url: str
    dlq_url: str
    dlq_physical: str
    max_receives: int  # the RedrivePolicy's maxReceiveCount


@dataclass(frozen=True)
class _Held:
    body: str
    sent_ms: str


def _decode(body: str) -> dict[str, Any]:
    """A body as the payload dict; what is not a JSON object (a foreign producer) comes back
    as {"body": ...}, which no payload model accepts, so a consumer nacks it as poison."""
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"body": body}


def _string(value: str) -> dict[str, str]:
    return {"DataType": "String", "StringValue": value}


def _attribute_bytes(attrs: dict[str, dict[str, str]]) -> int:
    # SQS counts an attribute's name, type and value in the message's size.
    return sum(
        len(k) + len(v["DataType"]) + len(v["StringValue"].encode()) for k, v in attrs.items()
    )


def _not_before(m: dict[str, Any]) -> float:
    """When a message hopping over a long delay is due (0: it is not one)."""
    value = m.get("MessageAttributes", {}).get("trace.not_before", {}).get("StringValue")
    try:
        return float(value) if value else 0.0
    except ValueError:  # not ours to hold back
        return 0.0


def _when(ms: str | None) -> datetime | None:
    return datetime.fromtimestamp(int(ms) / 1000, UTC) if ms and ms.isdigit() else None


class SqsQueue:
    def __init__(
        self,
        client: Any,
        *,
        prefix: str = "trace-",
        urls: dict[str, str] | None = None,
        create: bool = False,
        max_attempts: int = 20,
        list_wait_seconds: int = 1,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.urls = dict(urls or {})
        self.create = create
        self.max_attempts = max_attempts
        self.list_wait_seconds = list_wait_seconds  # long polls see every SQS server
        self._queues: dict[str, QueueRef] = {}
        self._lock = threading.Lock()
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._held_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> SqsQueue:
        secret = settings.sqs_secret_access_key
        client = boto3.client(
            "sqs",
            endpoint_url=settings.sqs_endpoint_url,
            region_name=settings.sqs_region,
            aws_access_key_id=settings.sqs_access_key_id,
            aws_secret_access_key=secret.get_secret_value() if secret else None,
            # A long poll holds its request up to MAX_WAIT: the read timeout must outlast it.
            config=Config(
                retries={"max_attempts": 5, "mode": "standard"},
                connect_timeout=5,
                read_timeout=MAX_WAIT + 10,
                max_pool_connections=32,
            ),
        )
        return cls(
            client,
            prefix=settings.sqs_queue_prefix,
            urls=settings.sqs_queue_urls,
            create=bool(settings.sqs_create_queues),
            max_attempts=settings.queue_max_attempts,
        )

    # -- queues --------------------------------------------------------------------------
    def physical(self, queue_name: str) -> str:
        """The SQS queue name of a Trace queue (no request made)."""
        url = self.urls.get(queue_name)
        return queue_name_of_url(url) if url else physical_name(self.prefix, queue_name)

    @_unavailable
    def resolve(self, queue_name: str) -> QueueRef:
        """The SQS queue and DLQ of a Trace queue: created or looked up on first use, then
        remembered for the driver's life."""
        q = self._queues.get(queue_name)
        if q is None:
            with self._lock:  # one creation per driver at a time; each queue resolved once
                q = self._queues.get(queue_name) or self._resolve(queue_name)
                self._queues[queue_name] = q
        return q

    def _resolve(self, queue_name: str) -> QueueRef:
        physical = self.physical(queue_name)
        url = self.urls.get(queue_name)
        if url is None and self.create:
            url = self._create_pair(physical)
        elif url is None:
            url = self._url(physical, queue_name)
        attrs = self._attributes(url, ["RedrivePolicy"])
        if "RedrivePolicy" not in attrs:
            raise SqsError(
                f"SQS queue {url} (queue {queue_name!r}) has no RedrivePolicy: Trace needs a "
                "dead-letter queue for poison messages; give it one (maxReceiveCount = "
                "TRACE_QUEUE_MAX_ATTEMPTS)"
            )
        policy = json.loads(attrs["RedrivePolicy"])
        arn = str(policy["deadLetterTargetArn"])
        dlq_physical, account = arn.rsplit(":", 1)[-1], arn.split(":")[4]
        dlq_url = self._url(dlq_physical, queue_name, account)
        return QueueRef(
            queue_name, physical, url, dlq_url, dlq_physical, int(policy["maxReceiveCount"])
        )

    def _create_pair(self, physical: str) -> str:
        size = str(MAX_MESSAGE_BYTES)
        dlq = self._create(
            physical + DLQ_SUFFIX,
            {"MessageRetentionPeriod": str(DLQ_RETENTION), "MaximumMessageSize": size},
        )
        arn = self._attributes(dlq, ["QueueArn"])["QueueArn"]
        policy = {"deadLetterTargetArn": arn, "maxReceiveCount": self.max_attempts}
        return self._create(
            physical, {"RedrivePolicy": json.dumps(policy), "MaximumMessageSize": size}
        )

    def _create(self, physical: str, attributes: dict[str, str]) -> str:
        try:
            return str(
                self.client.create_queue(QueueName=physical, Attributes=attributes)["QueueUrl"]
            )
        except ClientError as e:
            if not _codes(e) & _EXISTS:
                raise SqsError(f"cannot create SQS queue {physical}: {e}") from None
        # It exists with other attributes (made by hand, or by another max_attempts): its own
        # settings win, and its RedrivePolicy is read back as any looked-up queue's.
        log.warning("SQS queue %s exists with other attributes; using it as it is", physical)
        return self._url(physical, physical)

    def _url(self, physical: str, queue_name: str, account: str | None = None) -> str:
        kwargs: dict[str, str] = {"QueueName": physical}
        if account:
            kwargs["QueueOwnerAWSAccountId"] = account
        try:
            return str(self.client.get_queue_url(**kwargs)["QueueUrl"])
        except ClientError as e:
            if _codes(e) & _MISSING:
                raise SqsError(
                    f"SQS queue {physical} (queue {queue_name!r}) does not exist: create it with "
                    f"its dead-letter queue, name it in TRACE_SQS_QUEUE_URLS, or set "
                    "TRACE_SQS_CREATE_QUEUES=true"
                ) from None
            raise

    @_unavailable
    def approximate_depths(self, queue_names: list[str]) -> dict[str, dict[str, int]]:
        """SQS's approximate message counts of each named queue that exists, for /metrics
        (metrics/state.py): ready (ApproximateNumberOfMessages), delayed, and leased (received,
        not yet deleted: NotVisible). One GetQueueAttributes a queue; a queue not made yet is
        left out (none is created for a scrape). SQS tells no message's age."""
        out: dict[str, dict[str, int]] = {}
        for name in queue_names:
            known = self._queues.get(name)
            url = known.url if known else self.urls.get(name)
            if url is None:
                try:
                    url = self._url(self.physical(name), name)
                except SqsError:
                    continue  # never made: nothing on it
            attrs = self._attributes(url, list(_DEPTHS.values()))
            out[name] = {state: int(attrs.get(attr, 0)) for state, attr in _DEPTHS.items()}
        return out

    def _attributes(self, url: str, names: list[str]) -> dict[str, str]:
        return dict(
            self.client.get_queue_attributes(QueueUrl=url, AttributeNames=names).get(
                "Attributes", {}
            )
        )

    # -- publish -------------------------------------------------------------------------
    def publish(self, queue_name: str, payload_json: Any, delay_seconds: int = 0) -> None:
        self.publish_many(queue_name, [payload_json], delay_seconds)

    @_unavailable
    def publish_many(self, queue_name: str, payloads_: list[Any], delay_seconds: int = 0) -> None:
        """Every payload is validated and sized before anything is sent; then batches of 10
        (and 256 KiB). A batch SQS fails part-way raises after the earlier batches were sent:
        the outbox sends the group again, and duplicates are allowed."""
        attrs: dict[str, dict[str, str]] = {}
        if delay_seconds > MAX_DELAY:
            attrs["trace.not_before"] = _string(repr(time.time() + delay_seconds))
        bodies = [self._body(queue_name, p, attrs) for p in payloads_]
        if not bodies:
            return
        q = self.resolve(queue_name)
        delay = whole_seconds(delay_seconds, MAX_DELAY)
        for chunk in body_batches(bodies):
            self._send(q.url, queue_name, [(b, delay, attrs) for b in chunk])

    def _body(self, queue_name: str, payload: Any, attrs: dict[str, dict[str, str]]) -> str:
        try:
            body = payloads.encode(payload)
        except PayloadError as e:
            raise PayloadError(f"queue {queue_name}: {e}") from None
        size = len(body.encode()) + _attribute_bytes(attrs)
        if size > MAX_MESSAGE_BYTES:
            raise PayloadError(
                f"queue {queue_name}: a message of {size} bytes; SQS messages must stay under "
                f"{MAX_MESSAGE_BYTES} bytes (send a pointer to the data, not the data)"
            )
        return body

    def _send(
        self, url: str, queue_name: str, entries: list[tuple[str, int, dict[str, dict[str, str]]]]
    ) -> None:
        pending = {str(i): e for i, e in enumerate(entries)}
        for _ in range(SEND_TRIES):
            resp = self.client.send_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": i, "MessageBody": b, "DelaySeconds": d, "MessageAttributes": a}
                    if a
                    else {"Id": i, "MessageBody": b, "DelaySeconds": d}
                    for i, (b, d, a) in pending.items()
                ],
            )
            failed = resp.get("Failed", [])
            if not failed:
                return
            refused = [f for f in failed if f.get("SenderFault")]
            if refused:
                f = refused[0]
                raise SqsError(
                    f"SQS refused a message to queue {queue_name}: {f.get('Code')}: {f.get('Message')}"
                )
            pending = {f["Id"]: pending[f["Id"]] for f in failed}  # SQS's own fault: again
        raise SqsError(
            f"SQS failed {len(pending)} messages to queue {queue_name} {SEND_TRIES} times"
        )

    # -- receive -------------------------------------------------------------------------
    @_unavailable
    def receive(
        self,
        queue_name: str,
        max_messages: int,
        visibility_timeout_seconds: float,
        wait_seconds: float = 0,
        ack: list[str] | tuple[str, ...] = (),
    ) -> list[Message]:
        settle = [h for _, h in self._own(queue_name, list(ack))]  # all checked before anything
        q = self.resolve(queue_name)
        if settle:
            self._delete(q, settle)  # before the lease: if it raises, the caller keeps its acks
        visibility = whole_seconds(visibility_timeout_seconds, MAX_VISIBILITY)
        deadline = time.monotonic() + wait_seconds
        msgs: list[Message] = []
        while len(msgs) < max_messages:
            want = min(BATCH, max_messages - len(msgs))
            # Only the first call may wait: later ones take what is ready now.
            wait = 0 if msgs else whole_seconds(deadline - time.monotonic(), MAX_WAIT)
            raw = self.client.receive_message(
                QueueUrl=q.url,
                MaxNumberOfMessages=want,
                VisibilityTimeout=visibility,
                WaitTimeSeconds=wait,
                MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            msgs += self._messages(q, raw)
            if len(raw) < want and (msgs or time.monotonic() >= deadline):
                break  # nothing more is ready, and either something came or the wait is over
        return msgs

    def _messages(self, q: QueueRef, raw: list[dict[str, Any]]) -> list[Message]:
        out: list[Message] = []
        early: list[dict[str, Any]] = []
        for m in raw:
            if _not_before(m) > time.time():
                early.append(m)
                continue
            attrs = m.get("Attributes", {})
            count = int(attrs.get("ApproximateReceiveCount", "1"))
            handle = m["ReceiptHandle"]
            if count >= q.max_receives:  # only a final delivery's nack copies it into the DLQ
                self._hold(handle, _Held(m["Body"], attrs.get("SentTimestamp", "")))
            out.append(Message(_decode(m["Body"]), receipt(q.physical, count, handle), count))
        if early:
            self._hop(q, early)
        return out

    def _hop(self, q: QueueRef, early: list[dict[str, Any]]) -> None:
        """Messages whose delay is longer than SQS's: sent again with the rest of it, then
        deleted (the copy first: a crash between leaves a duplicate, never a loss)."""
        for m in early:
            attrs = {k: _string(v["StringValue"]) for k, v in m["MessageAttributes"].items()}
            rest = _not_before(m) - time.time()
            self._send(q.url, q.name, [(m["Body"], whole_seconds(rest, MAX_DELAY), attrs)])
        self._delete(q, [m["ReceiptHandle"] for m in early])

    def _hold(self, handle: str, held: _Held) -> None:
        with self._held_lock:
            self._held[handle] = held
            while len(self._held) > HELD_MAX:
                self._held.popitem(last=False)

    # -- settle --------------------------------------------------------------------------
    def _own(self, queue_name: str, receipts: list[str]) -> list[tuple[int, str]]:
        """(delivery count, handle) of the receipts that came from this queue (each receipt
        checked: ValueError for one this driver did not issue); another queue's hold nothing
        here, and no request is made for them."""
        physical = self.physical(queue_name)
        parsed = [split_receipt(r) for r in receipts]
        return [(count, handle) for where, count, handle in parsed if where == physical]

    def ack(self, queue_name: str, receipt: str) -> bool:
        return self.ack_many(queue_name, [receipt]) == 1

    @_unavailable
    def ack_many(self, queue_name: str, receipts: list[str]) -> int:
        """How many deletes SQS accepted. Not fenced: SQS also accepts a superseded or an
        already deleted receipt (see the module's notes); only a refused handle counts 0."""
        handles = [h for _, h in self._own(queue_name, receipts)]
        return self._delete(self.resolve(queue_name), handles) if handles else 0

    def _delete(self, q: QueueRef, handles: list[str]) -> int:
        unique = list(dict.fromkeys(handles))  # SQS refuses one handle twice in a batch
        done = 0
        for chunk in batches(unique):
            resp = self.client.delete_message_batch(
                QueueUrl=q.url,
                Entries=[{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(chunk)],
            )
            done += len(resp.get("Successful", []))
            failed = [f for f in resp.get("Failed", []) if not f.get("SenderFault")]
            with self._held_lock:
                for h in chunk:
                    self._held.pop(h, None)
            if failed:  # SQS's own fault: the caller may try again (a redelivery otherwise)
                raise SqsError(f"SQS failed to delete {len(failed)} messages of queue {q.name}")
        return done

    def _change(self, q: QueueRef, handle: str, seconds: int) -> bool:
        try:
            self.client.change_message_visibility(
                QueueUrl=q.url, ReceiptHandle=handle, VisibilityTimeout=seconds
            )
        except ClientError as e:
            codes = _codes(e)
            if codes & _LOST:
                return False
            if "InvalidParameterValue" in codes:  # past SQS's 12 hours since the receive
                log.warning("queue %s: SQS refused a visibility of %d s: %s", q.name, seconds, e)
                return False
            raise
        return True

    @_unavailable
    def extend_visibility(
        self, queue_name: str, receipt: str, visibility_timeout_seconds: float
    ) -> bool:
        mine = self._own(queue_name, [receipt])
        if not mine:
            return False
        [(_, handle)] = mine
        seconds = whole_seconds(visibility_timeout_seconds, MAX_VISIBILITY)
        return self._change(self.resolve(queue_name), handle, seconds)

    @_unavailable
    def nack(self, queue_name: str, receipt: str, error: str, delay_seconds: float = 0) -> bool:
        mine = self._own(queue_name, [receipt])
        if not mine:
            return False
        [(count, handle)] = mine
        q = self.resolve(queue_name)
        with self._held_lock:
            held = self._held.get(handle)
        if count >= q.max_receives and held is not None:
            return self._bury(q, handle, held, count, error)
        if count >= q.max_receives:
            log.warning(
                "queue %s: final delivery nacked by a process that did not receive it; the "
                "redrive policy moves it on a later receive, without this error: %s",
                queue_name,
                error,
            )
        else:
            log.info("queue %s: delivery %d nacked: %s", queue_name, count, error)
        return self._change(q, handle, whole_seconds(delay_seconds, MAX_VISIBILITY))

    def _bury(self, q: QueueRef, handle: str, held: _Held, count: int, error: str) -> bool:
        """The final delivery into the DLQ with its error (SQS's redrive would move it without
        one): held a while so no one else takes it meanwhile, copied, then deleted."""
        if not self._change(q, handle, BURY_HOLD):
            return False
        attrs = {
            "trace.queue": _string(attribute_text(q.name)),
            "trace.error": _string(attribute_text(error)),
            "trace.attempts": {"DataType": "Number", "StringValue": str(count)},
        }
        if held.sent_ms:
            attrs["trace.created"] = {"DataType": "Number", "StringValue": held.sent_ms}
        self._send(q.dlq_url, q.name, [(held.body, 0, attrs)])
        if not self._delete(q, [handle]):
            log.warning(
                "queue %s: a dead-lettered message was not deleted (a duplicate follows)", q.name
            )
        return True

    # -- dead letters --------------------------------------------------------------------
    @_unavailable
    def dead_letters(self, queue_name: str) -> list[dict[str, Any]]:
        """The queue's dead letters, oldest first, left in the DLQ (see the module's notes)."""
        q = self.resolve(queue_name)
        found: dict[str, dict[str, Any]] = {}
        handles: list[str] = []
        try:
            while len(handles) < DEAD_LETTERS_MAX:
                raw = self.client.receive_message(
                    QueueUrl=q.dlq_url,
                    MaxNumberOfMessages=BATCH,
                    VisibilityTimeout=DLQ_HOLD,
                    WaitTimeSeconds=self.list_wait_seconds,
                    MessageSystemAttributeNames=["All"],
                    MessageAttributeNames=["All"],
                ).get("Messages", [])
                if not raw:
                    break
                for m in raw:
                    handles.append(m["ReceiptHandle"])
                    record = self._dead(q, m)
                    if record is not None:
                        found.setdefault(m["MessageId"], record)
        finally:
            self._release(q, handles)
        return sorted(found.values(), key=lambda r: (r["created_at"] is None, r["created_at"] or 0))

    def _dead(self, q: QueueRef, m: dict[str, Any]) -> dict[str, Any] | None:
        attrs = {k: v.get("StringValue", "") for k, v in m.get("MessageAttributes", {}).items()}
        system = m.get("Attributes", {})
        source = system.get("DeadLetterQueueSourceArn", "")
        if attrs.get("trace.queue", q.name) != q.name or (
            source and source.rsplit(":", 1)[-1] != q.physical
        ):
            return None  # a DLQ shared with another queue: not this one's
        buried = "trace.error" in attrs
        return {
            "id": m["MessageId"],
            "queue_name": q.name,
            "payload": _decode(m["Body"]),
            "created_at": _when(attrs.get("trace.created") or system.get("SentTimestamp")),
            # SQS's redrive keeps a message's SentTimestamp and says nowhere when it moved it.
            "dead_at": _when(system.get("SentTimestamp")) if buried else None,
            "attempts": int(attrs.get("trace.attempts") or q.max_receives),
            "last_error": attrs.get("trace.error", REDRIVEN),
        }

    def _release(self, q: QueueRef, handles: list[str]) -> None:
        for chunk in batches(list(dict.fromkeys(handles))):
            resp = self.client.change_message_visibility_batch(
                QueueUrl=q.dlq_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
                    for i, h in enumerate(chunk)
                ],
            )
            if resp.get("Failed"):  # they come back by themselves after DLQ_HOLD
                log.warning(
                    "queue %s: %d dead letters stay hidden %d s",
                    q.name,
                    len(resp["Failed"]),
                    DLQ_HOLD,
                )

    def close(self) -> None:
        self.client.close()
