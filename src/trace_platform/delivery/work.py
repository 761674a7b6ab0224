"""Delivery work from a landed `alert_deliveries` batch: in the sink's state transaction (the
same one that settles the buffer record), one `deliveries` row per new idempotency key, its
body fixed there for good, and for each pending one an outbox row waking a Delivery Service
(`{"kind":"delivery","delivery_id"}` on the `delivery` queue). A batch landed twice (a sink
killed after its upsert) makes nothing twice: the key is unique.

A row is the routing task's claim: it makes a delivery only when its idempotency key is the one
its (org, alert, destination) derive, and its status, severity and destination are ones the
platform makes. Anything else (a key squatting another alert's, a status of `delivered`) is
logged and makes nothing."""

from __future__ import annotations

import json
import logging
import re
import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from trace_platform.alerts.datasets import SEVERITIES
from trace_platform.alerts.routing import idempotency_key
from trace_platform.dag.schema import NAME_RE
from trace_platform.queue.payloads import Delivery, encode
from trace_platform.store.deliveries import DeliveryStore
from trace_platform.store.tasks import Wakeup

log = logging.getLogger("trace.delivery")

QUEUE = "delivery"


def _plain(v: Any) -> Any:
    obj = getattr(v, "obj", v)  # a Jsonb cell: its value
    return obj.isoformat() if isinstance(obj, datetime) else obj


def body(row: dict[str, Any]) -> str:
    """The webhook body of a delivery: canonical JSON (sorted keys, no spaces)."""
    doc = {
        "type": "alert",
        "idempotency_key": row["idempotency_key"],
        "destination": row["destination"],
        "dag_id": row["alert_dag_id"],
        "job": row["alert_job"],
        "rule": row["rule"],
        "dedupe_key": row["dedupe_key"],
        "severity": row["severity"],
        "event_time": row["event_time"],
        "payload": row["payload"],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)


def refused(org_id: Any, row: dict[str, Any]) -> str | None:
    """Why a routed row makes no delivery (None: it is one the router makes)."""
    if row.get("status") not in ("pending", "suppressed"):
        return f"status {row.get('status')!r}"
    if row.get("severity") not in SEVERITIES:
        return f"severity {row.get('severity')!r}"
    dest = row.get("destination")
    if not isinstance(dest, str) or not re.fullmatch(NAME_RE, dest):
        return f"destination {dest!r}"
    alert = {
        "dag_id": row.get("alert_dag_id"),
        "job": row.get("alert_job"),
        "rule": row.get("rule"),
        "dedupe_key": row.get("dedupe_key"),
    }
    if row.get("idempotency_key") != idempotency_key(org_id, alert, dest):
        return "an idempotency key that is not its alert's and destination's"
    return None


def from_batch(
    conn: Connection[Any], rec: dict[str, Any], names: list[str], values: list[list[Any]]
) -> list[Wakeup]:
    """The deliveries of a landed batch of the org's alert_deliveries; returns the outbox rows
    to write in the same transaction."""
    store = DeliveryStore(conn)
    wake: list[Wakeup] = []
    org = rec["org_id"]  # the record's, never the row's
    for v in values:
        row = {n: _plain(x) for n, x in zip(names, v, strict=True)}
        why = refused(org, row)
        if why is not None:
            log.warning(
                "alert_deliveries batch %s: a row with %s: no delivery", rec["record_id"], why
            )
            continue
        made = store.insert_delivery(
            delivery_id=uuid.uuid4(),
            org_id=org,
            idempotency_key=row["idempotency_key"],
            destination=row["destination"],
            record_id=rec["record_id"],
            rule=row["rule"],
            severity=row["severity"],
            event_time=row["event_time"],
            body=body(row),
            status=row["status"],
            reason=row.get("reason"),
        ).fetchone()
        if made is not None and made["status"] == "pending":
            payload = encode(Delivery(delivery_id=made["delivery_id"]))
            wake.append(Wakeup(queue=QUEUE, payload=payload, delay=0))
    return wake
