"""The sqs driver passes the QueueDriver conformance suite against moto's SQS server on
127.0.0.1 (the session's `s3_endpoint` server: moto serves every service on one port), plus
checks of what is SQS's own: redrive, the size limit, visibility, batching, long delays."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.queue_conformance import QueueDriverConformance, wake
from trace_platform.config import ObjectStoreBackend, Profile, QueueBackend, Settings
from trace_platform.queue import make_driver, sqs
from trace_platform.queue.driver import Message, QueueDriver
from trace_platform.queue.payloads import PayloadError, TaskWakeup
from trace_platform.queue.sqs import REDRIVEN, SqsError, SqsQueue
from trace_platform.queue.sqs_format import split_receipt

MAX_ATTEMPTS = 3


def _settings(endpoint: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "queue_driver": QueueBackend.sqs,
        "queue_max_attempts": MAX_ATTEMPTS,
        "sqs_endpoint_url": endpoint,
        # Each test's own prefix: moto keeps every queue of the session in memory.
        "sqs_queue_prefix": f"t{uuid.uuid4().hex[:8]}-",
        "sqs_access_key_id": "testing",
        "sqs_secret_access_key": "testing",
        **overrides,
    }
    return Settings(**values)


def _driver(endpoint: str, **overrides: Any) -> SqsQueue:
    drv = make_driver(_settings(endpoint, **overrides), dsn="")  # SQS needs no DSN
    assert isinstance(drv, SqsQueue)
    # Listing dead letters ends on an empty receive, a long poll of 1 s so that it asks every
    # one of AWS's servers; moto is one server, which a short poll sees whole.
    drv.list_wait_seconds = 0
    return drv


def _lease_runs_out(drv: SqsQueue, queue: str, msg: Message) -> None:
    """What a lease's timeout does (the message visible again, its receive counted), now."""
    handle = split_receipt(msg.receipt)[2]
    drv.client.change_message_visibility(
        QueueUrl=drv.resolve(queue).url, ReceiptHandle=handle, VisibilityTimeout=0
    )


@pytest.fixture(scope="module", autouse=True)
def _moto_retention_check_in_constant_time() -> Iterator[None]:
    """moto (in this process: ThreadedMotoServer) checks each message it returns against the
    queue's retention period by computing every queue attribute, counts of all its messages
    among them: a receive of 10 from 250 messages took 0.1-0.8 s. The same rule, read from
    the one attribute it needs, for this module's tests."""
    from moto.core.utils import unix_time
    from moto.sqs.models import SQSBackend

    def valid(self: SQSBackend, queue_name: str, message: Any) -> bool:
        period = int(self.get_queue(queue_name).message_retention_period)
        return bool(period + message.sent_timestamp / 1000 > unix_time())

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SQSBackend, "is_message_valid_based_on_retention_period", valid)
        yield


@pytest.fixture
def drv(s3_endpoint: str) -> Iterator[SqsQueue]:
    d = _driver(s3_endpoint)
    yield d
    d.close()


class TestSqsConformance(QueueDriverConformance):
    max_attempts = MAX_ATTEMPTS
    lease_unit = 1.0  # VisibilityTimeout is whole seconds
    fenced_receipts = False
    unfenced_reason = (
        "SQS does not fence receipt handles: a DeleteMessage with a handle an older receive "
        "got succeeds (AWS: 'the request will still succeed, but the message might not be "
        "deleted'; moto deletes it), and so does one of a message already deleted; the sqs "
        "driver can only report a handle SQS refuses. See "
        "test_acks_after_the_lease_moved_on_leave_nothing_behind for what every driver gives."
    )
    exclusive_leases = False
    shared_leases_reason = (
        "SQS standard queues deliver at least once and may hand one message to two receives "
        "(AWS documents occasional duplicates; moto's receive is not synchronised across its "
        "server threads, getmoto/moto#519, and gave 2 copies of 400 to 4 consumers here)"
    )

    @pytest.fixture
    def driver(self, drv: SqsQueue) -> SqsQueue:
        return drv

    def raw_publish(self, driver: QueueDriver, queue: str, body: dict[str, Any]) -> None:
        assert isinstance(driver, SqsQueue)
        driver.client.send_message(QueueUrl=driver.resolve(queue).url, MessageBody=json.dumps(body))


def _calls(drv: SqsQueue, operation: str) -> list[dict[str, Any]]:
    """Every request of `operation` the driver's client makes from now on (its parameters)."""
    seen: list[dict[str, Any]] = []
    drv.client.meta.events.register(
        f"provide-client-params.sqs.{operation}", lambda params, **_: seen.append(dict(params))
    )
    return seen


def test_settings_of_the_aws_profile(s3_endpoint: str) -> None:
    """The aws profile's adapters: SQS and S3, queues created on first use (a buffered dataset's
    queue is made at its first deploy) unless turned off; Lite keeps pgqueue and a directory."""
    aws = Settings(
        profile=Profile.aws, state_dsn="postgresql://x@h/x", operator_registry="production"
    )
    assert aws.queue_driver is QueueBackend.sqs and aws.sqs_create_queues is True
    assert aws.object_store is ObjectStoreBackend.s3
    lite = Settings()
    assert lite.queue_driver is QueueBackend.pgqueue
    assert lite.object_store is ObjectStoreBackend.local
    pinned = Settings(
        profile=Profile.aws,
        state_dsn="postgresql://x@h/x",
        sqs_create_queues=False,
        object_store=ObjectStoreBackend.local,
        operator_registry="production",
    )
    assert pinned.sqs_create_queues is False and pinned.object_store is ObjectStoreBackend.local
    with pytest.raises(ValueError, match="sqs_queue_prefix"):
        Settings(sqs_queue_prefix="bad prefix!")


def test_queue_layout_dlq_redrive_policy_and_size_limit(drv: SqsQueue) -> None:
    """A Trace queue is prefix + escaped name, its DLQ that + "-dlq", named by a
    RedrivePolicy with maxReceiveCount = queue_max_attempts; both refuse over 256 KiB."""
    name = f"buffer.{uuid.uuid4().hex}"
    ref = drv.resolve(name)
    assert ref.physical == drv.prefix + name.replace(".", "-2e")
    assert ref.dlq_physical == ref.physical + "-dlq" and ref.max_receives == MAX_ATTEMPTS
    attrs = drv.client.get_queue_attributes(QueueUrl=ref.url, AttributeNames=["All"])["Attributes"]
    policy = json.loads(attrs["RedrivePolicy"])
    assert policy["deadLetterTargetArn"].endswith(":" + ref.dlq_physical)
    assert int(policy["maxReceiveCount"]) == MAX_ATTEMPTS
    assert attrs["MaximumMessageSize"] == str(256 * 1024)


def test_redrive_to_the_dlq_after_max_receive_count(drv: SqsQueue) -> None:
    """A consumer that dies on every delivery (no nack): SQS's redrive policy moves the
    message on the receive after the last allowed one; dead_letters lists it, and again."""
    q = f"q_{uuid.uuid4().hex[:8]}"
    body = wake()
    drv.publish(q, body)
    for n in range(1, MAX_ATTEMPTS + 1):
        [msg] = drv.receive(q, 1, 30)
        assert msg.delivery_count == n
        _lease_runs_out(drv, q, msg)  # nobody acked or nacked
    assert drv.receive(q, 1, 30) == []
    for _ in range(2):  # listing does not consume the DLQ
        [dead] = drv.dead_letters(q)
        assert dead["payload"] == body and dead["attempts"] == MAX_ATTEMPTS
        assert dead["last_error"] == REDRIVEN and dead["queue_name"] == q


def test_a_final_nack_from_another_process_is_redriven_without_its_error(
    s3_endpoint: str,
) -> None:
    """Only the driver that received a message holds its body for the DLQ copy; another
    one's final nack gives it back, and the redrive policy moves it (the error only logged)."""
    a = _driver(s3_endpoint)
    b = _driver(s3_endpoint, sqs_queue_prefix=a.prefix)
    q = "tasks"
    a.publish(q, wake())
    for _ in range(MAX_ATTEMPTS - 1):
        [msg] = a.receive(q, 1, 30)
        assert a.nack(q, msg.receipt, "retry")
    [final] = a.receive(q, 1, 30)
    assert final.delivery_count == MAX_ATTEMPTS
    assert b.nack(q, final.receipt, "from elsewhere")
    assert b.receive(q, 1, 30) == []  # this receive is the one SQS's redrive moves it on
    [dead] = b.dead_letters(q)
    assert dead["last_error"] == REDRIVEN
    a.close()
    b.close()


def test_only_a_final_delivery_keeps_its_body_for_the_dead_letter_copy(drv: SqsQueue) -> None:
    """A received body is kept only where a nack may copy it into the DLQ: on its final
    delivery. Not for every message a consumer takes (HELD_MAX of them, up to 256 KiB each)."""
    q = f"q_{uuid.uuid4().hex[:8]}"
    drv.publish_many(q, [wake() for _ in range(5)])
    for n in range(1, MAX_ATTEMPTS):
        msgs = drv.receive(q, 10, 30)
        assert {m.delivery_count for m in msgs} == {n} and len(msgs) == 5
        assert not drv._held
        assert all(drv.nack(q, m.receipt, "again") for m in msgs)
    final = drv.receive(q, 10, 30)
    assert {m.delivery_count for m in final} == {MAX_ATTEMPTS} and len(drv._held) == 5
    assert drv.ack_many(q, [m.receipt for m in final]) == 5
    assert not drv._held


def test_the_256_kib_limit_is_refused_before_sending_naming_queue_and_size(
    drv: SqsQueue,
) -> None:
    q = f"q_{uuid.uuid4().hex[:8]}"
    huge = {"kind": "task_wakeup", "task_id": str(uuid.uuid4()), "pad": "x" * (256 * 1024)}
    sends = _calls(drv, "SendMessageBatch")
    with pytest.raises(PayloadError, match=rf"queue {q}: .*\b26\d{{4}} bytes"):
        drv.publish_many(q, [wake(), huge])
    assert sends == []  # all or nothing: the valid one was not sent either
    assert drv.receive(q, 10, 30) == []
    # What SQS itself would refuse: a body over the queue's MaximumMessageSize.
    with pytest.raises(Exception, match="shorter than 262144"):
        drv.client.send_message(QueueUrl=drv.resolve(q).url, MessageBody="x" * (256 * 1024 + 1))


def _wakeup_of(body_bytes: int) -> TaskWakeup:
    """A valid wake-up whose JSON is `body_bytes` long: start_day is any integer, so its digits
    make a body as big as one likes."""
    short = len(TaskWakeup(task_id=uuid.uuid4(), start_day=0).model_dump_json())
    return TaskWakeup(task_id=uuid.uuid4(), start_day=10 ** (body_bytes - short))


def test_the_limit_counts_the_encoded_body_and_its_attributes(drv: SqsQueue) -> None:
    """The encoded body (payloads.encode's check), plus the attribute a delay over SQS's 900 s
    adds (the driver's own: SQS counts attributes in a message's size), under 256 KiB."""
    q = f"q_{uuid.uuid4().hex[:8]}"
    assert len(_wakeup_of(1000).model_dump_json()) == 1000
    sends = _calls(drv, "SendMessageBatch")
    for payload, delay in [(_wakeup_of(256 * 1024 + 1), 0), (_wakeup_of(256 * 1024 - 8), 901)]:
        with pytest.raises(PayloadError, match=rf"queue {q}: .*\b26\d{{4}} bytes"):
            drv.publish(q, payload, delay_seconds=delay)
    assert sends == []
    drv.publish(q, _wakeup_of(256 * 1024 - 8))  # without the attribute it fits
    assert [len(e["MessageBody"]) for c in sends for e in c["Entries"]] == [256 * 1024 - 8]


def test_a_batch_is_cut_at_256_kib_of_bodies(drv: SqsQueue) -> None:
    q = f"q_{uuid.uuid4().hex[:8]}"
    sends = _calls(drv, "SendMessageBatch")
    drv.publish_many(q, [_wakeup_of(100_000) for _ in range(3)] + [wake()])
    assert [len(c["Entries"]) for c in sends] == [2, 2]


def test_visibility_extended_past_the_original_timeout(drv: SqsQueue) -> None:
    q = f"q_{uuid.uuid4().hex[:8]}"
    drv.publish(q, wake())
    [msg] = drv.receive(q, 1, 1)
    assert drv.extend_visibility(q, msg.receipt, 2.5)  # rounded up to 3 s from now
    time.sleep(1.3)  # past the original 1 s
    assert drv.receive(q, 1, 30) == []
    [again] = drv.receive(q, 1, 30, wait_seconds=4)  # back once the extension runs out
    assert again.delivery_count == 2 and again.payload == msg.payload
    assert drv.ack(q, again.receipt)
    assert drv.extend_visibility(q, again.receipt, 30) is False  # acked: SQS refuses it


def test_a_batch_of_25_is_3_calls_each_way(drv: SqsQueue) -> None:
    q = f"q_{uuid.uuid4().hex[:8]}"
    sends = _calls(drv, "SendMessageBatch")
    receives = _calls(drv, "ReceiveMessage")
    deletes = _calls(drv, "DeleteMessageBatch")
    bodies = [wake() for _ in range(25)]
    drv.publish_many(q, bodies)
    assert [len(c["Entries"]) for c in sends] == [10, 10, 5]
    msgs = drv.receive(q, 25, 30)
    assert sorted(m.payload["task_id"] for m in msgs) == sorted(b["task_id"] for b in bodies)
    assert [c["MaxNumberOfMessages"] for c in receives] == [10, 10, 5]
    assert drv.ack_many(q, [m.receipt for m in msgs]) == 25
    assert [len(c["Entries"]) for c in deletes] == [10, 10, 5]


def test_long_polling_waits_in_calls_of_at_most_20_seconds(
    drv: SqsQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait goes to SQS as WaitTimeSeconds (whole, at most MAX_WAIT a call); an empty long
    poll before the deadline is followed by another. MAX_WAIT is made 1 s here to see it."""
    monkeypatch.setattr(sqs, "MAX_WAIT", 1)
    q = f"q_{uuid.uuid4().hex[:8]}"
    receives = _calls(drv, "ReceiveMessage")
    started = time.monotonic()
    assert drv.receive(q, 1, 30, wait_seconds=2.5) == []
    assert 2.4 < time.monotonic() - started < 6
    waits = [c["WaitTimeSeconds"] for c in receives]
    assert len(waits) >= 2 and set(waits) == {1}, waits  # 3 unless a poll overran its second


def test_a_delay_longer_than_sqs_allows_hops(
    drv: SqsQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQS delays at most 900 s: a longer delay is sent as 900 s with its due time, and a
    receive that finds it early sends it on with the rest. MAX_DELAY is made 1 s here."""
    monkeypatch.setattr(sqs, "MAX_DELAY", 1)
    q = f"q_{uuid.uuid4().hex[:8]}"
    body = wake()
    sent = time.monotonic()
    drv.publish(q, body, delay_seconds=3)
    got = []
    while not got and time.monotonic() - sent < 10:
        got = drv.receive(q, 1, 30, wait_seconds=1)
    assert [m.payload for m in got] == [body]
    assert time.monotonic() - sent >= 2.8
    assert got[0].delivery_count == 1  # a hop is a fresh message: no delivery spent


def test_a_foreign_body_comes_back_as_poison(drv: SqsQueue) -> None:
    q = f"q_{uuid.uuid4().hex[:8]}"
    drv.client.send_message(QueueUrl=drv.resolve(q).url, MessageBody="not json")
    [msg] = drv.receive(q, 1, 30)
    assert msg.payload == {"body": "not json"}


def test_moto_accepts_a_superseded_receipt(drv: SqsQueue) -> None:
    """Why fenced_receipts is False: the old holder's ack deletes the message the new holder
    has (on AWS it may delete nothing), and the new holder's ack then succeeds too."""
    q = f"q_{uuid.uuid4().hex[:8]}"
    drv.publish(q, wake())
    [first] = drv.receive(q, 1, 30)
    _lease_runs_out(drv, q, first)
    [second] = drv.receive(q, 1, 30)
    assert drv.ack(q, first.receipt) is True
    assert drv.ack(q, second.receipt) is True


def test_looked_up_queues_must_exist_with_a_redrive_policy(s3_endpoint: str) -> None:
    looked_up = _driver(
        s3_endpoint,
        profile=Profile.aws,
        state_dsn="postgresql://x@h/x",
        operator_registry="production",
        sqs_create_queues=False,
    )
    assert looked_up.create is False
    with pytest.raises(SqsError, match=r"does not exist.*TRACE_SQS_CREATE_QUEUES"):
        looked_up.publish("tasks", wake())
    bare = looked_up.physical("tasks")
    looked_up.client.create_queue(QueueName=bare)
    with pytest.raises(SqsError, match="no RedrivePolicy"):
        looked_up.publish("tasks", wake())
    looked_up.close()


def test_a_queue_named_by_url_uses_its_own_dead_letter_queue(s3_endpoint: str) -> None:
    maker = _driver(s3_endpoint, sqs_queue_prefix="made-by-hand-" + uuid.uuid4().hex[:6])
    ref = maker.resolve("x")  # a queue pair made outside the driver under test
    drv = _driver(s3_endpoint, sqs_queue_urls={"tasks": ref.url}, sqs_create_queues=False)
    assert drv.resolve("tasks").dlq_url == ref.dlq_url
    drv.publish("tasks", wake())
    [msg] = maker.receive("x", 1, 30)  # the same SQS queue
    # A receipt carries the SQS queue's name, so it settles through either Trace name.
    assert drv.ack("tasks", msg.receipt)
    maker.close()
    drv.close()


def test_receipts_from_other_drivers_are_refused_or_ignored(drv: SqsQueue) -> None:
    q = f"q_{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match="not an sqs receipt"):
        drv.ack(q, "garbage")
    with pytest.raises(ValueError, match="not an sqs receipt"):
        drv.nack(q, "", "x")
    # A well-formed receipt of another SQS queue holds nothing here.
    assert drv.ack(q, "other-queue:1:handle") is False


def test_a_receipt_settles_nothing_through_another_queue_and_makes_no_request(
    drv: SqsQueue,
) -> None:
    """The driver keeps a receipt to its own queue: through another queue's name nothing is
    sent to SQS for it (not left to SQS to refuse a handle of another queue). A receipt forged
    for this queue (its name right, its handle or delivery count made up) is one SQS refuses."""
    q, other = f"q_{uuid.uuid4().hex[:8]}", f"q_{uuid.uuid4().hex[:8]}"
    drv.publish(q, wake())
    [msg] = drv.receive(q, 1, 30)
    drv.resolve(other)
    settles = [_calls(drv, op) for op in ("DeleteMessageBatch", "ChangeMessageVisibility")]
    assert drv.ack(other, msg.receipt) is False
    assert drv.ack_many(other, [msg.receipt, msg.receipt]) == 0
    assert drv.extend_visibility(other, msg.receipt, 30) is False
    assert drv.nack(other, msg.receipt, "not mine") is False
    assert drv.receive(other, 10, 30, ack=[msg.receipt]) == []
    assert settles == [[], []]
    for count in (1, MAX_ATTEMPTS, 999_999_999):
        forged = sqs.receipt(drv.physical(q), count, "forged" * 170)
        assert drv.ack(q, forged) is False
        assert drv.extend_visibility(q, forged, 30) is False
        assert drv.nack(q, forged, "forged") is False
    assert drv.ack(q, msg.receipt)


def test_a_queue_is_looked_up_once_per_driver(drv: SqsQueue) -> None:
    """Its URL, DLQ and redrive policy are read on first use only: publishing, receiving and
    settling after that make no lookup."""
    q = f"q_{uuid.uuid4().hex[:8]}"
    drv.publish(q, wake())
    lookups = [_calls(drv, op) for op in ("GetQueueUrl", "GetQueueAttributes", "CreateQueue")]
    drv.publish_many(q, [wake(), wake()])
    first, second, third = drv.receive(q, 10, 30)
    assert drv.extend_visibility(q, first.receipt, 30)
    assert drv.nack(q, second.receipt, "again", delay_seconds=30)
    assert drv.ack(q, third.receipt)
    assert drv.receive(q, 10, 30, ack=[first.receipt]) == []
    assert drv.dead_letters(q) == []
    assert lookups == [[], [], []]


def test_the_outbox_publishes_task_wakeups_to_sqs(
    settings: Settings, dsn: str, s3_endpoint: str
) -> None:
    """The Dispatcher's enqueue path unchanged, only the driver swapped: a created task's
    outbox row goes to SQS as its wake-up, and the row is marked sent."""
    from trace_platform.contract import TaskSpec
    from trace_platform.services import Services

    on_sqs = settings.model_copy(
        update={
            k: v
            for k, v in _settings(s3_endpoint).model_dump().items()
            if k.startswith(("queue_", "sqs_"))
        }
    )
    svc = Services.build(on_sqs, dsn)
    try:
        assert isinstance(svc.driver, SqsQueue)
        ref = svc.dispatcher.create_task(TaskSpec(job="j", operator="noop"))
        assert svc.publisher.drain() == 1 and svc.publisher.pending() == 0
        [msg] = svc.driver.receive(on_sqs.task_queue, 10, 30, wait_seconds=2)
        assert msg.payload == {"kind": "task_wakeup", "task_id": str(ref.task_id)}
        assert svc.driver.ack(on_sqs.task_queue, msg.receipt)
    finally:
        svc.close()


def test_an_existing_queue_with_other_attributes_is_used_as_it_is(s3_endpoint: str) -> None:
    first = _driver(s3_endpoint)
    assert first.resolve("tasks").max_receives == MAX_ATTEMPTS
    other = _driver(s3_endpoint, sqs_queue_prefix=first.prefix, queue_max_attempts=7)
    ref = other.resolve("tasks")  # CreateQueue says it exists: its own RedrivePolicy wins
    assert ref.url == first.resolve("tasks").url and ref.max_receives == MAX_ATTEMPTS
    first.close()
    other.close()


def test_sqs_away_is_one_error_class_a_caller_can_retry() -> None:
    import boto3
    from botocore.config import Config

    from trace_platform.db.embedded import free_port
    from trace_platform.queue.driver import QueueUnavailable

    client = boto3.client(
        "sqs",
        endpoint_url=f"http://127.0.0.1:{free_port()}",  # nothing listens there
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 1}, connect_timeout=1),
    )
    away = SqsQueue(client, create=True)
    with pytest.raises(QueueUnavailable, match="SQS"):
        away.publish("tasks", wake())
    with pytest.raises(SqsError):
        away.receive("tasks", 1, 30)
    with pytest.raises(PayloadError):  # a bad payload is still refused as one, first
        away.publish("tasks", {"kind": "nope"})
    away.close()
