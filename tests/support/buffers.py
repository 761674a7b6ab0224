"""Buffered datasets in tests: a claimed task's batch written under its attempt's prefix,
published through the Dispatcher as the wrapper would, and loaded by a sink."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import psycopg

from trace_platform.contract import BufferPublishRequest, BufferPublishResponse, Claim
from trace_platform.layout import buffer_prefix
from trace_platform.objectstore import ObjectStore, make_store
from trace_platform.services import Services
from trace_platform.sink.service import Sink


def object_store(s: Services) -> ObjectStore:
    store = make_store(s.settings)
    store.ensure_bucket()
    return store


def batch_key(s: Services, c: Claim, org_id: UUID, name: str = "b.jsonl") -> str:
    """A key below the claimed attempt's own buffer prefix."""
    return f"{buffer_prefix(org_id, c.task_id, c.attempt)}{name}"


def write_lines(s: Services, key: str, rows: list[Any]) -> str:
    """`rows` as JSONL at `key` (a str row is written as it is: a line that may not be JSON)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    object_store(s).put(key, ("\n".join(lines) + "\n").encode())
    return key


def publish(s: Services, c: Claim, dataset: str, key: str) -> BufferPublishResponse:
    """The claimed attempt's buffer publish, as its wrapper sends it."""
    return s.dispatcher.buffers.publish(
        BufferPublishRequest(
            task_id=c.task_id,
            attempt=c.attempt,
            lease_token=c.lease_token,
            dataset=dataset,
            location=key,
        )
    )


def sink(s: Services, **kw: Any) -> Sink:
    """A sink of this test's services, its queues filled (the outbox published) first."""
    s.publisher.drain()
    return Sink(s.dispatcher, s.driver, object_store(s), s.data_dsn, **kw)


def table_rows(s: Services, org_id: UUID, order_by: str) -> list[dict[str, Any]]:
    """Every row of the org's (one) buffered dataset's table."""
    with s.pool.connection() as conn:
        row = conn.execute(
            "SELECT table_name FROM buffered_datasets WHERE org_id = %s", (org_id,)
        ).fetchone()
        assert row is not None, "the org has no buffered dataset"
        schema, _, name = row["table_name"].partition(".")
        return conn.execute(
            psycopg.sql.SQL("SELECT * FROM {} ORDER BY {}").format(
                psycopg.sql.Identifier(schema, name), psycopg.sql.Identifier(order_by)
            )
        ).fetchall()
