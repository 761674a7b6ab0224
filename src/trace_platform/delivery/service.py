"""The Delivery Service loop (`trace delivery`): woken by `{"kind":"delivery","delivery_id"}`
messages (the outbox's, through the QueueDriver), each pass leases a batch of the deliveries
that are due with no live lease (new ones, a retry whose time came, one whose wake-up was lost
or whose sender died holding it) and sends them side by side. Postgres is the authority: a
delivery is sent only under a lease (a fresh token each pass, rows taken with SKIP LOCKED) and
its outcome is settled only by that lease's holder, so any number of services may run.

Nothing cancels a delivery: not a deploy, a cutover, a rollback or a paused DAG. It ends
`delivered`, or `failed` (refused by outbound safety, a redirect, a 4xx no retry can fix, a
missing destination, or still failing once `delivery_max_age_seconds` old)."""

from __future__ import annotations

import logging
import random
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
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
from trace_platform.queue.driver import QueueUnavailable
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
        batch: int = 50,
        concurrency: int = 8,
    ) -> None:
        self.pool = pool
        self.driver = driver
        self.vault = vault
        self.s = settings
        self.batch = batch
        self.sender = Sender(
            timeout=settings.delivery_timeout_seconds, platform_ports=platform_ports
        )
        # Sends in flight at once: a slow receiver holds one thread, not the service.
        self.sends = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="delivery")

    def close(self) -> None:
        self.sends.shutdown(wait=True)
        self.sender.close()

    # -- the loop -------------------------------------------------------------------------
    def serve(self, stop: threading.Event) -> None:
        idle = 0.0
        while not stop.is_set():
            try:
                handled = self.step(wait=idle)
            except (psycopg.OperationalError, QueueUnavailable) as e:  # one is away: again
                log.warning("delivery: %s; retrying", e)
                stop.wait(self.s.delivery_poll_seconds)
                handled = 0
            idle = 0.0 if handled else self.s.delivery_poll_seconds

    def step(self, wait: float = 0.0) -> int:
        """Takes the wake-ups waiting (each only says "a delivery is due": Postgres says
        which), then leases a batch of due deliveries and sends them; returns the attempts
        made plus the wake-ups taken. With none queued, it waits up to `wait` seconds for one
        (the queue's own wait, not a sleep: new work goes out as soon as its wake-up is
        published; a retry's time is still found by the lease after at most `wait`)."""
        visibility = self.s.delivery_lease_seconds + self.s.delivery_timeout_seconds
        msgs = self.driver.receive(QUEUE, self.batch, visibility, wait_seconds=wait)
        # Each is taken whatever it says (a malformed one too): none is read.
        if msgs:  # one round trip for the batch (one each was a fifth of a busy service's time)
            self.driver.ack_many(QUEUE, [m.receipt for m in msgs])
        return len(msgs) + self.send_due()

    def send_due(self) -> int:
        """One batch of due deliveries, leased together, sent side by side, each settled by
        its own lease; returns how many were attempted."""
        token = uuid.uuid4()
        with self.pool.connection() as conn:
            store = DeliveryStore(conn)
            rows = store.lease_due(
                limit=self.batch, token=token, lease_seconds=self.s.delivery_lease_seconds
            ).fetchall()
            dests: dict[tuple[UUID, str], dict[str, Any]] = {}
            for org in {r["org_id"] for r in rows}:
                names = sorted({r["destination"] for r in rows if r["org_id"] == org})
                for d in store.destinations_named(org_id=org, names=names).fetchall():
                    dests[(org, d["name"])] = d
        secrets = self._secrets(dests)
        done = [
            self.sends.submit(
                self._one, r, token, dests.get((r["org_id"], r["destination"])), secrets
            )
            for r in rows
        ]
        for f in done:
            f.result()
        return len(rows)

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
    def _secrets(self, dests: dict[tuple[UUID, str], dict[str, Any]]) -> dict[Any, str | Exception]:
        out: dict[Any, str | Exception] = {}
        for key, d in dests.items():
            try:
                out[key] = self.vault.open(key[0], sealed_name(d["name"]), d["secret"])
            except Exception as e:  # a key changed or lost: the admin must fix it, then retry
                out[key] = e
        return out

    def _one(
        self,
        row: dict[str, Any],
        token: UUID,
        dest: dict[str, Any] | None,
        secrets: dict[Any, str | Exception],
    ) -> str:
        started = datetime.now(UTC)
        secret = secrets.get((row["org_id"], row["destination"]))
        try:
            outcome = self._attempt(row, dest, secret)
        except Exception as e:  # never leave a leased delivery unsettled by a bug
            log.exception("delivery %s: attempt failed", row["delivery_id"])
            outcome = Outcome("retry", error=f"{type(e).__name__}: {e}"[:1000])
        self._settle(row, token, started, outcome)
        return outcome.outcome

    def _attempt(
        self, row: dict[str, Any], dest: dict[str, Any] | None, secret: str | Exception | None
    ) -> Outcome:
        if dest is None:
            return Outcome("failed", error=f"the org has no destination '{row['destination']}'")
        if not dest["enabled"]:
            return Outcome("retry", error=f"destination '{row['destination']}' is disabled")
        if not isinstance(secret, str):
            return Outcome("retry", error=f"signing secret unavailable: {secret}")
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
        # Pipelined: the attempt, the settle and the commit in two round trips, not four.
        with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
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
