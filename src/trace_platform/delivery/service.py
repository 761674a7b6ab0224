"""The Delivery Service loop (`trace delivery`): wakes on `{"kind":"delivery","delivery_id"}`
messages (the outbox's, through the QueueDriver), and sweeps Postgres for deliveries that are
due with no live lease (a retry's time come, a wake-up lost, a sender that died holding one).
Postgres is the authority: a delivery is sent only under a lease (a fresh token each attempt)
and its outcome is settled only by that lease's holder, so any number of services may run.

Nothing cancels a delivery: not a deploy, a cutover, a rollback or a paused DAG. It ends
`delivered`, or `failed` (refused by outbound safety, a redirect, a 4xx no retry can fix, a
missing destination, or still failing once `delivery_max_age_seconds` old)."""

from __future__ import annotations

import logging
import random
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg_pool import ConnectionPool

from trace_platform.config import Settings
from trace_platform.delivery.sender import Outcome, Sender
from trace_platform.delivery.signing import sealed_name
from trace_platform.delivery.work import QUEUE
from trace_platform.identity.vault import Vault
from trace_platform.queue import QueueDriver
from trace_platform.queue.payloads import Delivery, PayloadError, decode
from trace_platform.store.deliveries import DeliveryStore

log = logging.getLogger("trace.delivery")


def backoff(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Capped exponential backoff with jitter: in [d/2, d], d = min(cap, base * 2^(n-1))."""
    d = min(cap, base * 2 ** max(0, attempt - 1))
    return d * (rng or random).uniform(0.5, 1.0)


class DeliveryService:
    def __init__(
        self,
        pool: ConnectionPool[Any],
        driver: QueueDriver,
        vault: Vault,
        settings: Settings,
        *,
        platform_ports: set[int] | None = None,
        batch: int = 10,
    ) -> None:
        self.pool = pool
        self.driver = driver
        self.vault = vault
        self.s = settings
        self.batch = batch
        self.sender = Sender(
            timeout=settings.delivery_timeout_seconds, platform_ports=platform_ports
        )

    def close(self) -> None:
        self.sender.close()

    # -- the loop -------------------------------------------------------------------------
    def serve(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                handled = self.step()
            except psycopg.OperationalError as e:  # the database is away: try again
                log.warning("delivery: %s; retrying", e)
                handled = 0
            if not handled:
                stop.wait(self.s.delivery_poll_seconds)

    def step(self) -> int:
        """Wake-ups first, then the due deliveries no wake-up brought; returns the attempts
        made."""
        sent = 0
        visibility = self.s.delivery_lease_seconds + self.s.delivery_timeout_seconds
        for msg in self.driver.receive(QUEUE, self.batch, visibility):
            try:
                payload = decode(msg.payload)
            except PayloadError:
                payload = None
            if isinstance(payload, Delivery):
                sent += self.deliver(payload.delivery_id) is not None
            self.driver.ack(QUEUE, msg.receipt)
        with self.pool.connection() as conn:
            due = DeliveryStore(conn).due(grace_seconds=0, limit=self.batch).fetchall()
        for row in due:
            sent += self.deliver(row["delivery_id"]) is not None
        return sent

    def drain(self, timeout: float = 10.0) -> int:
        """Steps until one makes no attempt (tests, `trace delivery --once`)."""
        total = 0
        deadline = datetime.now(UTC) + timedelta(seconds=timeout)
        while datetime.now(UTC) < deadline:
            n = self.step()
            total += n
            if not n:
                break
        return total

    # -- one delivery ---------------------------------------------------------------------
    def deliver(self, delivery_id: UUID) -> str | None:
        """One attempt at a delivery, if it is due and no one else holds it; returns its
        outcome (None: not ours to send now)."""
        token = uuid.uuid4()
        with self.pool.connection() as conn:
            store = DeliveryStore(conn)
            row = store.lease(
                delivery_id=delivery_id,
                token=token,
                lease_seconds=self.s.delivery_lease_seconds,
            ).fetchone()
            dest = (
                store.destination(org_id=row["org_id"], name=row["destination"]).fetchone()
                if row is not None
                else None
            )
        if row is None:
            return None
        started = datetime.now(UTC)
        outcome = self._attempt(row, dest)
        self._settle(row, token, started, outcome)
        return outcome.outcome

    def _attempt(self, row: dict[str, Any], dest: dict[str, Any] | None) -> Outcome:
        if dest is None:
            return Outcome("failed", error=f"the org has no destination '{row['destination']}'")
        if not dest["enabled"]:
            return Outcome("retry", error=f"destination '{row['destination']}' is disabled")
        try:
            secret = self.vault.open(row["org_id"], sealed_name(dest["name"]), dest["secret"])
        except Exception as e:  # a key changed or lost: the admin must fix it, then retry
            return Outcome("retry", error=f"signing secret unavailable: {e}")
        return self.sender.send(
            url=dest["url"],
            allow_private=dest["allow_private"],
            secret=secret,
            msg_id=row["idempotency_key"],
            body=row["body"],
        )

    def _settle(self, row: dict[str, Any], token: UUID, started: datetime, o: Outcome) -> None:
        status, reason, next_at = "delivered", None, None
        if o.outcome in ("failed", "refused"):
            status, reason = "failed", o.error
        elif o.outcome == "retry":
            delay = backoff(
                row["attempts"],
                self.s.delivery_backoff_seconds,
                self.s.delivery_backoff_max_seconds,
            )
            if o.retry_after is not None:
                delay = max(delay, o.retry_after)
            next_at = datetime.now(UTC) + timedelta(seconds=delay)
            deadline = row["created_at"] + timedelta(seconds=self.s.delivery_max_age_seconds)
            if next_at > deadline:
                status = "failed"
                reason = (
                    f"gave up after {row['attempts']} attempt(s): the next would be past "
                    f"delivery_max_age_seconds={self.s.delivery_max_age_seconds:g}; last: {o.error}"
                )
                next_at = None
            else:
                status, reason = "pending", o.error
        with self.pool.connection() as conn, conn.transaction():
            store = DeliveryStore(conn)
            store.insert_attempt(
                delivery_id=row["delivery_id"],
                attempt=row["attempts"],
                started_at=started,
                status_code=o.status_code,
                latency_ms=o.latency_ms,
                outcome=o.outcome,
                error=o.error,
                address=o.address,
            )
            settled = store.settle(
                delivery_id=row["delivery_id"],
                token=token,
                status=status,
                reason=reason,
                next_attempt_at=next_at,
            ).fetchone()
        if settled is None:
            log.info(
                "delivery %s: lease lost before settling (another sender has it)",
                row["delivery_id"],
            )
