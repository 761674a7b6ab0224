"""Buffered datasets in the Dispatcher: an attempt's buffer publish (fenced like its events:
a buffer record and its outbox row in one transaction, the queue message only a pointer to
the record), and the trusted sink's outcome for a record (landed, with the dataset event and
the tasks it starts, in one transaction; or dead, with the reason its user reads)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from psycopg import Connection

from trace_platform import layout
from trace_platform.alerts.datasets import ALERT_DELIVERIES
from trace_platform.contract import (
    BufferPublishRequest,
    BufferPublishResponse,
    EventIn,
)
from trace_platform.delivery import work as delivery_work
from trace_platform.dispatcher.commits import Emitter
from trace_platform.dispatcher.fencing import fenced, reject_finished, reject_withdrawn
from trace_platform.errors import Conflict, Forbidden, Invalid
from trace_platform.objectstore import ObjectStoreError, check_key
from trace_platform.queue.payloads import BufferRecord, encode
from trace_platform.store.buffers import BufferStore
from trace_platform.store.registry import RegistryStore
from trace_platform.store.tasks import StateStore, StoreTx, Wakeup


def _conn(tx: StoreTx) -> Connection[Any]:
    conn = getattr(tx, "conn", None)
    if conn is None:
        raise TypeError("buffered datasets need the Postgres state store")
    return conn  # type: ignore[no-any-return]


def _storable(error: str) -> str:
    """A reason may quote the batch (a column's name): stored as text Postgres takes."""
    text = error[:4000].encode("utf-8", "backslashreplace").decode()
    return text.replace("\x00", "\\x00")


def batch_key_refused(org_id: UUID, task_id: UUID, attempt: int, key: str) -> str | None:
    """Why `key` is not a batch key attempt `attempt` of `task_id` may write (one below its
    own buffer prefix, as its scoped store let it write), or None when it is: what the publish
    accepts, and all the collector ever deletes of a batch (registry/collector.py)."""
    try:
        check_key(key)
    except (ObjectStoreError, ValueError) as e:
        return f"a batch's location: {e}"
    if not layout.attempt_owns(layout.buffer_root(org_id, task_id), task_id, attempt, key):
        want = layout.buffer_prefix(org_id, task_id, attempt)
        return f"batch {key!r} is not below this attempt's buffer prefix {want!r}"
    return None


class Buffers:
    def __init__(self, store: StateStore, emitter: Emitter) -> None:
        self.store = store
        self.emitter = emitter  # the dataset event of a landed batch, as any event

    # -- producer side (the wrapper, attempt-fenced) -----------------------------------------
    def publish(self, req: BufferPublishRequest) -> BufferPublishResponse:
        content_type = req.content_type
        if content_type is None:
            raise Invalid(f"a batch is a .jsonl or .parquet file, not {req.location!r}")
        with self.store.transaction() as tx:
            tx.lock_task_dag_shared(req.task_id)
            st = fenced(tx, req)
            reject_finished(st, req)
            reject_withdrawn(st, req)
            if st.get("cancel_requested"):  # its rows would land after the user said stop
                raise Conflict(
                    "task_canceled",
                    f"task {req.task_id} was canceled; its batches are no longer accepted",
                    status=st["status"],
                )
            conn = _conn(tx)
            ds = self._writable(conn, st, req.dataset)
            self._check_location(st, req)
            store = BufferStore(conn)
            row = store.insert_record(
                record_id=uuid.uuid4(),
                dataset_uuid=ds["dataset_uuid"],
                org_id=st["org_id"],  # the task's, never anything the batch says
                task_id=req.task_id,
                attempt=req.attempt,
                start_day=st["start_day"],
                dag_id=st["dag_id"],
                job=st["job"],
                location=req.location,
                content_type=content_type,
            ).fetchone()
            if row is None:  # published before (a retried call): the same record answers
                again = store.record_by_location(
                    dataset_uuid=ds["dataset_uuid"], location=req.location
                ).fetchone()
                assert again is not None
                return BufferPublishResponse(
                    record_id=again["record_id"], dataset_uuid=ds["dataset_uuid"], duplicate=True
                )
            message = BufferRecord(dataset_uuid=ds["dataset_uuid"], record_id=row["record_id"])
            tx.insert_outbox(Wakeup(queue=ds["queue_name"], payload=encode(message), delay=0))
        return BufferPublishResponse(
            record_id=row["record_id"], dataset_uuid=ds["dataset_uuid"], duplicate=False
        )

    @staticmethod
    def _writable(conn: Connection[Any], st: dict[str, Any], name: str) -> dict[str, Any]:
        """The buffered dataset `name` of the task's org, if the task's job is one of its
        writers. An unknown name answers as a refused one (no probing for names)."""
        ds = BufferStore(conn).buffered_by_name(org_id=st["org_id"], name=name).fetchone()
        dag = (
            RegistryStore(conn).dag_by_id(dag_id=st["dag_id"]).fetchone() if st["dag_id"] else None
        )
        writer = f"{dag['name']}.{st['job']}" if dag else None
        if ds is None or writer not in ds["writers"]:
            raise Forbidden(
                f"job {writer or st['job']!r} may not publish to buffered dataset '{name}' "
                "(no such dataset, or the job is not one of its writers)"
            )
        return dict(ds)

    @staticmethod
    def _check_location(st: dict[str, Any], req: BufferPublishRequest) -> None:
        """Only this attempt's own keys: what the scoped store let it write."""
        why = batch_key_refused(st["org_id"], req.task_id, req.attempt, req.location)
        if why is not None:
            raise Forbidden(why)

    # -- sink side (trusted) ------------------------------------------------------------------
    def record(self, record_id: UUID) -> dict[str, Any] | None:
        """A record and what the sink needs of its dataset, counting this try of it."""
        with self.store.transaction() as tx:
            store = BufferStore(_conn(tx))
            row = store.record_for_sink(record_id=record_id).fetchone()
            if row is not None and row["status"] == "pending":
                tries = store.count_sink_attempt(record_id=record_id).fetchone()
                row = {**row, "sink_attempts": tries["sink_attempts"] if tries else 0}
            return dict(row) if row is not None else None

    @contextmanager
    def _pending(self, record_id: UUID) -> Iterator[tuple[StoreTx, dict[str, Any] | None]]:
        with self.store.transaction() as tx:
            row = BufferStore(_conn(tx)).record_for_sink(record_id=record_id).fetchone()
            yield tx, (dict(row) if row is not None and row["status"] == "pending" else None)

    def dead(self, record_id: UUID, error: str) -> bool:
        """The batch is refused for good, with why (`trace buffers list`)."""
        with self._pending(record_id) as (tx, rec):
            if rec is None:
                return False
            BufferStore(_conn(tx)).mark_dead(record_id=record_id, error=_storable(error))
            return True

    def failed_try(self, record_id: UUID, error: str) -> None:
        """A try that failed on something else than the batch (the store away, a bug): kept
        as the reason the dead letter gives if the tries run out."""
        with self.store.transaction() as tx:
            BufferStore(_conn(tx)).note_error(record_id=record_id, error=_storable(error))

    def landed(
        self,
        record_id: UUID,
        rows_read: int,
        rows_loaded: int,
        rows: tuple[list[str], list[list[Any]]] | None = None,
    ) -> int:
        """The batch's rows are in the table: the record is loaded (its artifact collectable)
        and the dataset's event starts its readers' tasks, in one transaction. Returns the
        tasks created (0 when another sink finished it first)."""
        with self._pending(record_id) as (tx, rec):
            if rec is None:
                return 0
            BufferStore(_conn(tx)).mark_loaded(
                record_id=record_id, rows_read=rows_read, rows_loaded=rows_loaded
            )
            if rows is not None and rec.get("platform") == ALERT_DELIVERIES.name:
                # The org's alert_deliveries: its delivery work, in the same transaction.
                for wake in delivery_work.from_batch(_conn(tx), rec, *rows):
                    tx.insert_outbox(wake)
            return self._emit(tx, rec, rows_loaded)

    def _emit(self, tx: StoreTx, rec: dict[str, Any], rows_loaded: int) -> int:
        ds = rec["dataset_uuid"]
        event = EventIn(
            dataset_uuid=ds,
            cursor=f"buffer:{rec['record_id']}",
            payload={"record_id": str(rec["record_id"]), "rows": rows_loaded},
        )
        # The publishing task is the event's producer; its dataset version is the one version
        # a buffered dataset has, so every live subscriber reads it (dag_tasks.subscribers),
        # each reader's DAG checked for access (no producing DAG: every reader is a shared one).
        producer = {
            "task_id": rec["task_id"],
            "org_id": rec["org_id"],
            "start_day": rec["start_day"],
            "dag_id": None,
            "dag_version": None,
            "run_id": None,
            "outputs": [{"dataset_uuid": str(ds), "dataset_version": str(rec["dataset_version"])}],
        }
        return self.emitter.start(tx, producer, rec["attempt"], [event])[2]

    def list_records(
        self,
        org_id: UUID,
        *,
        dataset: str | None = None,
        status: str | None = None,
        limit: int = 100,
        datasets: list[str] | None = None,
    ) -> list[dict[str, Any]]:
        """The org's records, newest first; only those of `datasets` when given."""
        with self.store.transaction() as tx:
            rows = BufferStore(_conn(tx)).list_records(
                org_id=org_id,
                dataset=dataset,
                status=status,
                limit=limit,
                datasets=datasets,
            )
            return [dict(r) for r in rows.fetchall()]

    def datasets(self, names: list[str]) -> list[dict[str, Any]]:
        """The buffered datasets a sink serves: the named ones, or all."""
        with self.store.transaction() as tx:
            rows = BufferStore(_conn(tx)).buffered_datasets(names=names).fetchall()
            return [dict(r) for r in rows]
