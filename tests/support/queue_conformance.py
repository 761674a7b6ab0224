"""The QueueDriver conformance suite (Dagster-style reusable storage tests).

Every driver (pgqueue now, SQS later) subclasses `QueueDriverConformance` and provides a
`driver` fixture plus `expire(queue)` / `raw_publish(queue, body)` helpers where the backend needs
them. The semantics checked are the protocol's: at-least-once, duplicates allowed, no ordering
guarantee, visibility timeout, dead-lettering after max attempts.
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
        first = driver.receive(queue, 10, 0.5)
        assert len(first) == 1
        assert driver.receive(queue, 10, 0.5) == []
        time.sleep(0.7)
        again = driver.receive(queue, 10, 30)
        assert len(again) == 1 and again[0].delivery_count == 2
        assert again[0].payload == first[0].payload

    def test_stale_receipt_cannot_ack(self, driver: QueueDriver, queue: str) -> None:
        driver.publish(queue, wake())
        first = driver.receive(queue, 1, 0.3)[0]
        time.sleep(0.5)
        second = driver.receive(queue, 1, 30)[0]
        assert driver.ack(queue, first.receipt) is False  # the lease moved on
        assert driver.ack(queue, second.receipt) is True

    def test_a_receipt_settles_only_through_its_own_queue(
        self, driver: QueueDriver, queue: str
    ) -> None:
        """Through another queue's name a receipt holds nothing: its ack, extend, nack and a
        receive carrying it change nothing; through its own, each works."""
        other = queue + "_other"
        driver.publish_many(queue, [wake() for _ in range(20)])
        driver.publish(other, wake())
        msgs = driver.receive(queue, 20, 0.5)  # a batch (whatever the driver leases as one)
        assert len(msgs) == 20
        first, second, third = msgs[0], msgs[1], msgs[2]
        assert driver.ack(other, first.receipt) is False
        assert driver.ack_many(other, [m.receipt for m in msgs]) == 0
        assert driver.extend_visibility(other, second.receipt, 30) is False
        assert driver.nack(other, third.receipt, "not mine") is False
        assert len(driver.receive(other, 10, 30, ack=[m.receipt for m in msgs])) == 1
        time.sleep(0.7)  # every lease ran out: nothing above settled or extended any of them
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
        msg = driver.receive(queue, 1, 0.5)[0]
        assert driver.extend_visibility(queue, msg.receipt, 30)
        time.sleep(0.7)
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
        # once every lease has run out.
        assert sorted(got) == sorted(b["task_id"] for b in bodies)
        assert driver.ack_many(queue, previous) == 0

    def test_a_folded_ack_of_a_stale_receipt_is_ignored(
        self, driver: QueueDriver, queue: str
    ) -> None:
        driver.publish(queue, wake())
        first = driver.receive(queue, 1, 0.3)[0]
        time.sleep(0.5)
        [again] = driver.receive(queue, 1, 0.3)  # the lease moved on to another consumer
        assert again.delivery_count == 2 and again.payload == first.payload
        # The old receipt acks nothing; the message is still held under the new lease, and
        # once that runs out the same call that names the old receipt leases it again.
        assert driver.receive(queue, 1, 30, ack=[first.receipt]) == []
        time.sleep(0.5)
        [third] = driver.receive(queue, 1, 30, ack=[first.receipt])
        assert third.delivery_count == 3
        assert driver.ack(queue, again.receipt) is False
        assert driver.ack(queue, third.receipt) is True

    def test_a_folded_ack_of_an_expired_lease_still_settles(
        self, driver: QueueDriver, queue: str
    ) -> None:
        body = wake()
        driver.publish(queue, body)
        msg = driver.receive(queue, 1, 0.3)[0]
        time.sleep(0.5)  # run out, but nobody leased it again: the receipt still names it
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
        assert set(seen) == {b["task_id"] for b in bodies}
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
