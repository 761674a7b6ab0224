"""A worker's acks, held for its next queue receive to carry (one statement acks the finished
wake-ups and leases the next ones)."""

from __future__ import annotations

import logging
import threading
import time

from trace_platform.queue.driver import Message, QueueDriver

log = logging.getLogger(__name__)


class HeldAcks:
    """Acks of one worker's wrappers, held for the next queue receive to carry: its statement
    deletes them and leases the next wake-ups in one commit (as Oban flushes acks with its next
    fetch). Each is added only after its attempt's completion committed. What no receive takes
    within `linger` seconds (every wrapper busy), and whatever is held at exit (`flush`), goes
    out alone with one `ack_many`. A message acked late is only invisible a while longer: if
    its lease ran out first, the redelivered wake-up is refused by the claim and dropped."""

    def __init__(self, driver: QueueDriver, queue_name: str, linger: float = 0.5) -> None:
        self.driver = driver
        self.queue_name = queue_name
        self.linger = linger
        self._lock = threading.Lock()
        self._held: list[str] = []
        self._since = 0.0  # when the oldest held receipt came
        self._thread: threading.Thread | None = None

    def submit(self, receipt: str) -> None:
        with self._lock:
            if not self._held:
                self._since = time.monotonic()
            self._held.append(receipt)
            if self._thread is None:
                self._thread = threading.Thread(target=self._linger, name="acks", daemon=True)
                self._thread.start()

    def take(self, limit: int = 1000) -> list[str]:
        """The held receipts (up to `limit`), for a receive to carry; `give_back` if it fails."""
        with self._lock:
            taken, self._held = self._held[:limit], self._held[limit:]
            if self._held:
                self._since = time.monotonic()
            return taken

    def receive(self, max_messages: int, visibility: float, wait_seconds: float) -> list[Message]:
        """Up to `max_messages` wake-ups, leased by the statement that acks what is held."""
        settled = self.take()
        try:
            return self.driver.receive(
                self.queue_name, max_messages, visibility, wait_seconds, ack=settled
            )
        except Exception as e:
            self.failed(settled, e)
            raise

    def give_back(self, receipts: list[str]) -> None:
        with self._lock:
            if receipts and not self._held:
                self._since = time.monotonic()
            self._held = receipts + self._held

    def failed(self, receipts: list[str], error: Exception) -> None:
        """Receipts a statement carrying them failed on: kept for the next one, unless the
        queue refused them as malformed (ValueError), which they would fail again forever."""
        if isinstance(error, ValueError):
            log.warning("dropping %d held acks the queue refused: %s", len(receipts), error)
        else:
            self.give_back(receipts)

    def flush(self) -> None:
        """Every held receipt, now, in one statement per thousand."""
        while taken := self.take():
            try:
                self.driver.ack_many(self.queue_name, taken)
            except Exception as e:
                self.failed(taken, e)
                raise

    def _linger(self) -> None:
        while True:
            with self._lock:
                if not self._held:  # nothing to wait for: the next submit starts another
                    self._thread = None
                    return
                wait = self._since + self.linger - time.monotonic()
            if wait > 0:
                time.sleep(wait)
                continue
            try:
                self.flush()
            except Exception as e:  # the database away: kept, tried again after `linger`
                log.warning("could not ack %s's finished wake-ups: %s", self.queue_name, e)
                with self._lock:
                    self._since = time.monotonic()
