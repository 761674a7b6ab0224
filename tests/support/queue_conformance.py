"""The QueueDriver conformance suite (Dagster-style reusable storage tests).

Every driver (pgqueue, sqs) subclasses `QueueDriverConformance` and provides a `driver`
fixture plus a `raw_publish(queue, body)` helper. The semantics checked are the protocol's:
at-least-once, duplicates allowed, no ordering guarantee, visibility timeout, dead-lettering
after max attempts.

Two guarantees are driver-specific, and a driver says whether it gives them (a test of one
skips, giving the driver's reason, where it does not):
- `fenced_receipts`: a receipt whose lease passed on (another receive got the message), or
  whose message was already acked, settles nothing and reports False. pgqueue checks the
  lease token; SQS accepts a superseded or settled receipt handle (see queue/sqs.py).
- `exclusive_leases`: while acks are prompt, two receives never lease one message at once.
  pgqueue locks rows; an SQS standard queue may deliver a message twice.
And one is a driver's granularity, not a guarantee: `lease_unit`, the shortest lease the driver
counts (SQS counts whole seconds), to which the tests' short leases are rounded up.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from trace_platform.queue.driver import QueueDriver
from trace_platform.queue.payloads import MAX_PAYLOAD_BYTES, PayloadError


def wake(task_id: uuid.UUID | None = None) -> dict[str, Any]:
    return {"kind": "task_wakeup", "task_id": str(task_id or uuid.uuid4())}


class QueueDriverConformance:
    max_attempts = 3  # drivers under test are built with this many deliveries before dead-letter
    lease_unit = 0.0  # seconds; 0: any fraction
    fenced_receipts = True
    exclusive_leases = True
    # Why a driver lacks a guarantee above: the skip's reason (required when it is False).
    unfenced_reason = ""
    shared_leases_reason = ""

    def lease(self, seconds: float) -> float:
        """A short lease for a test, as long as the driver can count it."""
        unit = self.lease_unit
        return seconds if not unit else max(unit, -(-seconds // unit) * unit)

    def outlast(self, seconds: float) -> None:
        """Sleep until a lease of `seconds` (as `lease` rounds it) has run out."""
        time.sleep(self.lease(seconds) + 0.2)

    def need_fenced_receipts(self) -> None:
        if not self.fenced_receipts:
            assert self.unfenced_reason, "a driver without fenced receipts must say why"
            pytest.skip(self.unfenced_reason)

    def raw_publish(self, driver: QueueDriver, queue: str, body: dict[str, Any]) -> None:
        """Put a message on the queue bypassing validation (a corrupt or foreign producer)."""
        raise NotImplementedError

    @pytest.fixture
    def queue(self) -> str:
        return f"q_{uuid.uuid4().hex[:8]}"

    def test_publish_receive_ack(self, driver: QueueDriver, queue: str) -> None:
        body = wake()
        driver.publish(queue, body)
        msgs = driver.receive(queue, 10, 30)
        assert [m.payload for m in msgs] == [body]
        assert msgs[0].delivery_count == 1
        assert driver.ack(queue, msgs[0].receipt)
        assert driver.receive(queue, 10, 30) == []

    def test_queues_are_separate(self, driver: QueueDriver, queue: str) -> None:
        driver.publish(queue, wake())
        assert driver.receive(queue + "_other", 10, 30) == []
        assert len(driver.receive(queue, 10, 30)) == 1

    def test_leased_message_is_invisible_then_redelivered(
        self, driver: QueueDriver, queue: str
    ) -> None:
        driver.publish(queue, wake())
        first = driver.receive(queue, 10, self.lease(0.5))
        assert len(first) == 1
        assert driver.receive(queue, 10, self.lease(0.5)) == []
        self.outlast(0.5)
        again = driver.receive(queue, 10, 30)
        assert len(again) == 1 and again[0].delivery_count == 2
        assert again[0].payload == first[0].payload

    def test_stale_receipt_cannot_ack(self, driver: QueueDriver, queue: str) -> None:
        self.need_fenced_receipts()
        driver.publish(queue, wake())
        first = driver.receive(queue, 1, self.lease(0.3))[0]
        self.outlast(0.3)
        second = driver.receive(queue, 1, 30)[0]
        assert driver.ack(queue, first.receipt) is False  # the lease moved on
        assert driver.ack(queue, second.receipt) is True

    def test_acks_after_the_lease_moved_on_leave_nothing_behind(
        self, driver: QueueDriver, queue: str
    ) -> None:
        """Every driver, fenced or not: the old holder's ack and the new holder's ack of one
        message raise nothing, and between them the message is gone for good."""
        driver.publish(queue, wake())
        first = driver.receive(queue, 1, self.lease(0.3))[0]
        self.outlast(0.3)
        [second] = driver.receive(queue, 1, self.lease(0.3))
        assert second.payload == first.payload and second.delivery_count == 2
        assert isinstance(driver.ack(queue, first.receipt), bool)
        assert isinstance(driver.ack(queue, second.receipt), bool)
        self.outlast(0.3)
        assert driver.receive(queue, 10, 30) == []
        assert driver.extend_visibility(queue, second.receipt, 30) is False

    def test_a_receipt_settles_only_through_its_own_queue(
        self, driver: QueueDriver, queue: str
    ) -> None:
        """Through another queue's name a receipt holds nothing: its ack, extend, nack and a
        receive carrying it change nothing; through its own, each works."""
        other = queue + "_other"
        driver.publish_many(queue, [wake() for _ in range(20)])
        driver.publish(other, wake())
        msgs = driver.receive(queue, 20, self.lease(0.5))  # a batch (however the driver leases)
        assert len(msgs) == 20
        first, second, third = msgs[0], msgs[1], msgs[2]
        assert driver.ack(other, first.receipt) is False
        assert driver.ack_many(other, [m.receipt for m in msgs]) == 0
        assert driver.extend_visibility(other, second.receipt, 30) is False
        assert driver.nack(other, third.receipt, "not mine") is False
        assert len(driver.receive(other, 10, 30, ack=[m.receipt for m in msgs])) == 1
        self.outlast(0.5)  # every lease ran out: nothing above settled or extended any of them
        again = driver.receive(queue, 30, 30)
        assert len(again) == 20 and {m.delivery_count for m in again} == {2}
        assert driver.extend_visibility(queue, again[0].receipt, 30)
        assert driver.nack(queue, again[1].receipt, "mine")
        assert driver.ack_many(queue, [m.receipt for m in again[2:]]) == 18
        back = driver.receive(queue, 10, 30)
        assert len(back) == 1 and back[0].delivery_count == 3
        assert driver.ack(queue, back[0].receipt) and driver.ack(queue, again[0].receipt)

    def test_extend_visibility(self, driver: QueueDriver, queue: str) -> None:
        driver.publish(queue, wake())
        msg = driver.receive(queue, 1, self.lease(0.5))[0]
        assert driver.extend_visibility(queue, msg.receipt, 30)
        self.outlast(0.5)
        assert driver.receive(queue, 1, 30) == []
        assert driver.ack(queue, msg.receipt)

    def test_delayed_message(self, driver: QueueDriver, queue: str) -> None:
        driver.publish(queue, wake(), delay_seconds=1)
        assert driver.receive(queue, 1, 30) == []
        msgs = driver.receive(queue, 1, 30, wait_seconds=3)
        assert len(msgs) == 1

    def test_batch_publish_and_receive(self, driver: QueueDriver, queue: str) -> None:
        bodies = [wake() for _ in range(250)]
        driver.publish_many(queue, bodies)
        got: list[str] = []
        while msgs := driver.receive(queue, 100, 30):
            got.extend(m.payload["task_id"] for m in msgs)
            assert driver.ack_many(queue, [m.receipt for m in msgs]) == len(msgs)
        assert sorted(got) == sorted(b["task_id"] for b in bodies)

    def test_acks_fold_into_the_next_receive(self, driver: QueueDriver, queue: str) -> None:
        bodies = [wake() for _ in range(25)]
        driver.publish_many(queue, bodies)
        got: list[str] = []
        previous: list[str] = []
        while msgs := driver.receive(queue, 10, 30, ack=previous):
            got.extend(m.payload["task_id"] for m in msgs)
            previous = [m.receipt for m in msgs]
        # The last, empty receive acked the last batch: nothing is left to redeliver, even
        # once every lease has run out. No lease is left to extend; and a fenced driver says
        # the receipts settle nothing more.
        assert sorted(got) == sorted(b["task_id"] for b in bodies)
        assert not any(driver.extend_visibility(queue, r, 30) for r in previous)
        if self.fenced_receipts:
            assert driver.ack_many(queue, previous) == 0

    def test_a_folded_ack_of_a_stale_receipt_is_ignored(
        self, driver: QueueDriver, queue: str
    ) -> None:
        self.need_fenced_receipts()
        driver.publish(queue, wake())
        first = driver.receive(queue, 1, self.lease(0.3))[0]
        self.outlast(0.3)
        [again] = driver.receive(queue, 1, self.lease(0.3))  # the lease moved on to another
        assert again.delivery_count == 2 and again.payload == first.payload
        # The old receipt acks nothing; the message is still held under the new lease, and
        # once that runs out the same call that names the old receipt leases it again.
        assert driver.receive(queue, 1, 30, ack=[first.receipt]) == []
        self.outlast(0.3)
        [third] = driver.receive(queue, 1, 30, ack=[first.receipt])
        assert third.delivery_count == 3
        assert driver.ack(queue, again.receipt) is False
        assert driver.ack(queue, third.receipt) is True

    def test_a_folded_ack_of_an_expired_lease_still_settles(
        self, driver: QueueDriver, queue: str
    ) -> None:
        body = wake()
        driver.publish(queue, body)
        msg = driver.receive(queue, 1, self.lease(0.3))[0]
        self.outlast(0.3)  # run out, but nobody leased it again: the receipt still names it
        assert driver.receive(queue, 1, 30, ack=[msg.receipt]) == []
        assert driver.receive(queue, 1, 30) == []

    def test_a_malformed_folded_ack_changes_nothing(self, driver: QueueDriver, queue: str) -> None:
        driver.publish(queue, wake())
        held = driver.receive(queue, 1, 30)[0]
        driver.publish(queue, wake())
        with pytest.raises(ValueError, match="receipt"):
            driver.receive(queue, 1, 30, ack=[held.receipt, "not-a-receipt"])
        # Nothing was acked and nothing leased.
        assert len(driver.receive(queue, 10, 30)) == 1
        assert driver.ack(queue, held.receipt) is True

    def test_invalid_payloads_rejected_and_nothing_stored(
        self, driver: QueueDriver, queue: str
    ) -> None:
        bad: list[Any] = [
            {"kind": "task_wakeup"},  # missing task_id
            {"kind": "task_wakeup", "task_id": "nope"},
            {"kind": "mystery", "id": 1},
            {"kind": "task_wakeup", "task_id": str(uuid.uuid4()), "extra": 1},
            "{not json",
        ]
        for body in bad:
            with pytest.raises(PayloadError):
                driver.publish(queue, body)
        with pytest.raises(PayloadError):  # one bad payload fails the whole batch
            driver.publish_many(queue, [wake(), {"kind": "delivery"}])
        assert driver.receive(queue, 10, 30) == []

    def test_oversized_payload_rejected(self, driver: QueueDriver, queue: str) -> None:
        huge = {"kind": "task_wakeup", "task_id": str(uuid.uuid4()), "pad": "x" * MAX_PAYLOAD_BYTES}
        with pytest.raises(PayloadError, match="bytes"):
            driver.publish(queue, huge)
        assert driver.receive(queue, 10, 30) == []

    def test_nack_redelivers_then_dead_letters(self, driver: QueueDriver, queue: str) -> None:
        driver.publish(queue, wake())
        for n in range(1, self.max_attempts + 1):
            msgs = driver.receive(queue, 1, 30)
            assert len(msgs) == 1 and msgs[0].delivery_count == n
            assert driver.nack(queue, msgs[0].receipt, f"boom {n}")
        assert driver.receive(queue, 1, 30) == []
        dead = driver.dead_letters(queue)
        assert len(dead) == 1
        assert dead[0]["attempts"] == self.max_attempts
        assert dead[0]["last_error"] == f"boom {self.max_attempts}"

    def test_poison_dead_letters_and_nothing_else(self, driver: QueueDriver, queue: str) -> None:
        self.raw_publish(driver, queue, {"kind": "task_wakeup", "task_id": "corrupt"})
        good = [wake() for _ in range(5)]
        driver.publish_many(queue, good)
        acked: list[str] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msgs = driver.receive(queue, 10, 30)
            if not msgs:
                break
            for m in msgs:
                if m.payload.get("task_id") == "corrupt":
                    driver.nack(queue, m.receipt, "poison message: task_id is not a UUID")
                else:
                    driver.ack(queue, m.receipt)
                    acked.append(m.payload["task_id"])
        assert sorted(acked) == sorted(g["task_id"] for g in good)
        dead = driver.dead_letters(queue)
        assert [d["payload"]["task_id"] for d in dead] == ["corrupt"]
        assert "poison" in dead[0]["last_error"]

    def test_competing_consumers_each_message_once(self, driver: QueueDriver, queue: str) -> None:
        bodies = [wake() for _ in range(400)]
        driver.publish_many(queue, bodies)
        seen: Counter[str] = Counter()
        lock = threading.Lock()

        def consume() -> None:
            while msgs := driver.receive(queue, 7, 30):
                with lock:
                    seen.update(m.payload["task_id"] for m in msgs)
                driver.ack_many(queue, [m.receipt for m in msgs])

        threads = [threading.Thread(target=consume) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(seen) == {b["task_id"] for b in bodies}  # at least once, every driver
        if not self.exclusive_leases:
            assert self.shared_leases_reason, "a driver without exclusive leases must say why"
            pytest.skip(f"every message seen; not checked once only: {self.shared_leases_reason}")
        assert max(seen.values()) == 1  # no double lease while acks are prompt

    def test_idle_consumer_wakes_on_publish(self, driver: QueueDriver, queue: str) -> None:
        got: list[Any] = []
        t = threading.Thread(
            target=lambda: got.extend(driver.receive(queue, 1, 30, wait_seconds=10))
        )
        t.start()
        time.sleep(0.3)
        sent = time.monotonic()
        driver.publish(queue, wake())
        t.join(timeout=10)
        waited = time.monotonic() - sent
        assert len(got) == 1
        # Woken by the publish, not by the end of the 10 s wait.
        assert waited < 5, waited
