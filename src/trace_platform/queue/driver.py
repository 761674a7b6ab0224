"""The one queue abstraction (deployment-profiles note): every internal queue use goes through it.

Semantics every driver must give (and the conformance suite checks): at-least-once delivery,
duplicates allowed, no ordering guarantee, visibility timeout, poison messages dead-lettered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from trace_platform.errors import TraceError


class QueueUnavailable(TraceError):
    """A driver's backend refused or could not be reached; trying again later may work.
    (pgqueue's are psycopg's own errors, which its callers already retry.)"""

    status_code = 503
    code = "queue_unavailable"


@dataclass(frozen=True)
class Message:
    payload: dict[str, Any]
    receipt: str  # opaque: only the driver that issued it can interpret it
    delivery_count: int  # best effort; 1 on first delivery


@runtime_checkable
class QueueDriver(Protocol):
    def publish(self, queue_name: str, payload_json: Any, delay_seconds: int = 0) -> None:
        """Enqueue one typed payload (see `queue.payloads`); raises PayloadError if invalid."""

    def publish_many(self, queue_name: str, payloads: list[Any], delay_seconds: int = 0) -> None:
        """Batched publish, all-or-nothing validation."""

    def receive(
        self,
        queue_name: str,
        max_messages: int,
        visibility_timeout_seconds: float,
        wait_seconds: float = 0,
        ack: list[str] | tuple[str, ...] = (),
    ) -> list[Message]:
        """Lease up to `max_messages`; wait up to `wait_seconds` for one if none is ready.
        `ack`: earlier receipts to acknowledge first, committed with the lease (or before the
        wait), as `ack_many` would; a receipt that lost its lease is ignored, a malformed one
        refused before anything happens."""

    def ack(self, queue_name: str, receipt: str) -> bool:
        """Delete a received message; False if the receipt no longer holds the lease. A
        receipt settles (ack, extend, nack) only through the name of the queue it came from:
        through any other it is a receipt that holds nothing."""

    def ack_many(self, queue_name: str, receipts: list[str]) -> int:
        """Batched ack; returns how many receipts still held their lease."""

    def extend_visibility(
        self, queue_name: str, receipt: str, visibility_timeout_seconds: float
    ) -> bool:
        """Push the lease out to now + timeout; False if the lease was lost.

        A driver that leases a batch as one (pgqueue, from BATCH_LEASE_MIN messages) may
        extend the message's batch-mates with it, and then never shortens the lease while
        the batch holds any of them. Give a message back early with `nack`, not by
        extending it to zero."""

    def nack(self, queue_name: str, receipt: str, error: str, delay_seconds: float = 0) -> bool:
        """Give a message back after a failure, recording `error`; the last allowed
        delivery goes straight to the dead-letter store."""

    def dead_letters(self, queue_name: str) -> list[dict[str, Any]]:
        """Messages that exhausted their deliveries (inspection and tests)."""

    def close(self) -> None: ...
