"""Delivery work from a landed `alert_deliveries` batch: in the sink's state transaction (the
same one that settles the buffer record), one `deliveries` row per new idempotency key, its
body fixed there for good, and for each pending one an outbox row waking a Delivery Service
(`{"kind":"delivery","delivery_id"}` on the `delivery` queue). A batch landed twice (a sink
killed after its upsert) makes nothing twice: the key is unique."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from psycopg import Connection

from trace_platform.alerts.datasets import ALERT_DELIVERIES
from trace_platform.queue.payloads import Delivery, encode
from trace_platform.store.buffers import BufferStore
from trace_platform.store.deliveries import DeliveryStore
from trace_platform.store.tasks import Wakeup

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


def from_batch(
    conn: Connection[Any], rec: dict[str, Any], names: list[str], values: list[list[Any]]
) -> list[Wakeup]:
    """The deliveries of a landed batch if its dataset is the org's alert_deliveries (else
    nothing); returns the outbox rows to write in the same transaction."""
    ds = BufferStore(conn).buffered_by_uuid(dataset_uuid=rec["dataset_uuid"]).fetchone()
    if ds is None or ds.get("platform") != ALERT_DELIVERIES.name:
        return []
    store = DeliveryStore(conn)
    wake: list[Wakeup] = []
    for v in values:
        row = {n: _plain(x) for n, x in zip(names, v, strict=True)}
        made = store.insert_delivery(
            delivery_id=uuid.uuid4(),
            org_id=rec["org_id"],  # the record's, never the row's
            idempotency_key=row["idempotency_key"],
            destination=row["destination"],
            record_id=rec["record_id"],
            rule=row["rule"],
            severity=row["severity"],
            event_time=row["event_time"],
            body=body(row),
            status="suppressed" if row["status"] == "suppressed" else "pending",
            reason=row.get("reason"),
        ).fetchone()
        if made is not None and made["status"] == "pending":
            payload = encode(Delivery(delivery_id=made["delivery_id"]))
            wake.append(Wakeup(queue=QUEUE, payload=payload, delay=0))
    return wake
