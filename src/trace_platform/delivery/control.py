"""What `trace destinations`, `trace deliveries` and `trace alerts` do, for an actor: the org's
destinations (admins only: where the platform sends data, and their secrets), its deliveries
(admins only: a delivery's body is an alert's payload) and its alerts (through the Query
Service, so `alert_events`' read_roles decide)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from psycopg_pool import ConnectionPool

from trace_platform import audit
from trace_platform.dag.schema import NAME_RE
from trace_platform.delivery import safety, signing
from trace_platform.errors import Conflict, Forbidden, Invalid, NotFound
from trace_platform.identity import Actor
from trace_platform.identity.vault import Vault
from trace_platform.store.deliveries import DeliveryStore

STATUSES = ("suppressed", "pending", "sending", "delivered", "failed")


def alerts_sql(rule: str | None = None, limit: int = 50) -> str:
    """The org's alerts ("would have alerted" included), newest first: a statement over
    `alert_events` for the Query Service, so its read_roles decide who reads them."""
    if rule is not None and not re.fullmatch(NAME_RE, rule):
        raise Invalid(f"a rule name matches {NAME_RE}")
    if not 0 < limit <= 1000:
        raise Invalid("limit is 1 to 1000")
    where = f" WHERE rule = '{rule}'" if rule else ""  # a checked name: no quote in it
    return (
        "SELECT event_time, rule, severity, dedupe_key, job, CAST(payload AS VARCHAR) AS payload"
        f" FROM alert_events{where} ORDER BY event_time DESC LIMIT {int(limit)}"
    )


def _admin(actor: Actor, what: str) -> None:
    if not actor.is_admin:
        raise Forbidden(f"only an org admin may {what}")


def _host(url: str) -> str:
    return urlsplit(url).hostname or ""


def _check_url(url: str) -> None:
    try:
        safety.check_url(url)
    except safety.Refused as e:
        raise Invalid(f"destination URL: {e}") from None


class DeliveryControl:
    def __init__(self, pool: ConnectionPool[Any], vault: Vault) -> None:
        self.pool = pool
        self.vault = vault

    # -- destinations ---------------------------------------------------------------------
    def add_destination(
        self, actor: Actor, name: str, url: str, *, allow_private: bool = False
    ) -> str:
        """Saves a destination; returns its signing secret (shown once)."""
        _admin(actor, "add a destination")
        if not re.fullmatch(NAME_RE, name):
            raise Invalid(f"destination name {name!r} must match {NAME_RE}")
        _check_url(url)
        secret = signing.new_secret()
        sealed = self.vault.seal(actor.org_id, signing.sealed_name(name), secret)
        with self.pool.connection() as conn, conn.transaction():
            made = (
                DeliveryStore(conn)
                .insert_destination(
                    org_id=actor.org_id,
                    name=name,
                    url=url,
                    secret=sealed,
                    allow_private=allow_private,
                    created_by=actor.user_id,
                )
                .fetchone()
            )
            if made is None:
                raise Conflict("destination_exists", f"destination '{name}' exists")
            # Never the signing secret; the URL only as far as its host (its path or query
            # may carry the receiver's own token).
            audit.record(
                conn,
                actor,
                "destination.add",
                name,
                {"host": _host(url), "allow_private": allow_private},
            )
        return secret

    def set_destination(
        self,
        actor: Actor,
        name: str,
        *,
        enabled: bool | None = None,
        allow_private: bool | None = None,
        url: str | None = None,
        rotate_secret: bool = False,
    ) -> str | None:
        """Changes what is given; with `rotate_secret`, returns the new signing secret (shown
        once: the old one no longer verifies)."""
        _admin(actor, "change a destination")
        if url is not None:
            _check_url(url)
        secret = signing.new_secret() if rotate_secret else None
        sealed = (
            self.vault.seal(actor.org_id, signing.sealed_name(name), secret) if secret else None
        )
        with self.pool.connection() as conn, conn.transaction():
            done = (
                DeliveryStore(conn)
                .set_destination(
                    org_id=actor.org_id,
                    name=name,
                    enabled=enabled,
                    allow_private=allow_private,
                    url=url,
                    secret=sealed,
                )
                .fetchone()
            )
            if done is None:
                raise NotFound(f"no destination '{name}'")
            changed: dict[str, Any] = {"enabled": enabled, "allow_private": allow_private}
            audit.record(
                conn,
                actor,
                "destination.change",
                name,
                {
                    **{k: v for k, v in changed.items() if v is not None},
                    **({"host": _host(url)} if url is not None else {}),
                    "secret_rotated": rotate_secret,
                },
            )
        return secret

    def list_destinations(self, actor: Actor) -> list[dict[str, Any]]:
        _admin(actor, "list destinations")
        with self.pool.connection() as conn:
            return DeliveryStore(conn).list_destinations(org_id=actor.org_id).fetchall()

    # -- deliveries -----------------------------------------------------------------------
    def list_deliveries(
        self,
        actor: Actor,
        *,
        status: str | None = None,
        destination: str | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        _admin(actor, "list deliveries")
        if status is not None and status not in STATUSES:
            raise Invalid(f"status is one of {', '.join(STATUSES)}")
        with self.pool.connection() as conn:
            return (
                DeliveryStore(conn)
                .list_deliveries(
                    org_id=actor.org_id, status=status, destination=destination, limit=limit
                )
                .fetchall()
            )

    def show(self, actor: Actor, delivery_id: UUID) -> dict[str, Any]:
        """A delivery, its body and every attempt."""
        _admin(actor, "read deliveries")
        with self.pool.connection() as conn:
            store = DeliveryStore(conn)
            row = store.delivery(org_id=actor.org_id, delivery_id=delivery_id).fetchone()
            if row is None:
                raise NotFound(f"no delivery {delivery_id}")
            return {**row, "attempt_log": store.attempts(delivery_id=delivery_id).fetchall()}

    def retry(self, actor: Actor, delivery_id: UUID) -> None:
        """A failed delivery sent again (same idempotency key, same body): the next Delivery
        Service pass takes it."""
        _admin(actor, "retry a delivery")
        with self.pool.connection() as conn, conn.transaction():
            store = DeliveryStore(conn)
            if store.retry(org_id=actor.org_id, delivery_id=delivery_id).fetchone() is None:
                # Why: absent (or another org's, which is the same to this one) or not failed.
                row = store.delivery(org_id=actor.org_id, delivery_id=delivery_id).fetchone()
                if row is None:
                    raise NotFound(f"no delivery {delivery_id}")
                raise Conflict(
                    "not_failed", f"delivery {delivery_id} is {row['status']}, not failed"
                )
            audit.record(conn, actor, "delivery.retry", delivery_id)

    def counts(self, actor: Actor) -> dict[str, int]:
        """The org's deliveries by status."""
        _admin(actor, "read deliveries")
        with self.pool.connection() as conn:
            rows = DeliveryStore(conn).delivery_counts(org_id=actor.org_id).fetchall()
        return {r["status"]: r["n"] for r in rows}

    def open_work(self, actor: Actor) -> int:
        """How much of the org's alert pipeline is still under way (0: settled)."""
        _admin(actor, "read deliveries")
        with self.pool.connection() as conn:
            row = DeliveryStore(conn).alert_work_open(org_id=actor.org_id).fetchone()
        return int(row["batches"] + row["tasks"] + row["deliveries"]) if row else 0
