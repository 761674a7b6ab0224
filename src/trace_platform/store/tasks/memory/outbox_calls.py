"""The outbox on the in-memory tables, as its queries in `db/sql/dispatcher.sql` (the writes)
and `outbox.sql` (the relay's) do."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from uuid import UUID

from trace_platform.store.tasks.memory.tables import _limit, _lt
from trace_platform.store.tasks.memory.tx_base import TxBase
from trace_platform.store.tasks.params import Wakeup
from trace_platform.store.tasks.protocol import Row


class OutboxCalls(TxBase):
    """The outbox: rows written with the state they announce, sent, purged."""

    def insert_outbox_many(self, ws: list[Wakeup]) -> None:
        for w in ws:
            self.insert_outbox(w)

    def insert_task_wakeup(self, task_id: UUID, w: Wakeup, by_runtime: dict[str, str]) -> None:
        s = self._t.task_status.get(task_id)
        r = self._t.task_registry.get(task_id)
        if s is None or r is None or r["start_day"] != s["start_day"]:
            return  # the SQL's join finds no row: nothing is written
        self.insert_outbox(replace(w, queue=by_runtime.get(r["runtime"], w.queue)))

    def insert_outbox(self, w: Wakeup) -> None:
        json.loads(w.payload)  # the jsonb column refuses text that is not JSON
        oid = next(self.store._outbox_ids)
        self._t.outbox[oid] = {
            "id": oid,
            "queue_name": w.queue,
            "payload": w.payload,  # the JSON text; read back parsed, as psycopg loads jsonb
            "delay_seconds": w.delay,
            "created_at": self.now,
            "sent_at": None,
            "publish_errors": 0,
            "last_error": None,
        }

    def claim_pending(self, limit: int) -> list[Row]:
        rows = [
            {
                "id": o["id"],
                "queue_name": o["queue_name"],
                "payload": json.loads(o["payload"]),  # jsonb, as psycopg loads it
                "delay_seconds": o["delay_seconds"],
            }
            for _, o in sorted(self._t.outbox.items())
            if o["sent_at"] is None
        ]
        return _limit(rows, limit)

    def mark_sent(self, ids: list[int]) -> None:
        for oid in set(ids):
            o = self._t.outbox.get(oid)
            if o is not None:
                o["sent_at"] = self.now

    def mark_failed(self, ids: list[int], error: str) -> None:
        for oid in set(ids):
            o = self._t.outbox.get(oid)
            if o is not None:
                o.update(publish_errors=o["publish_errors"] + 1, last_error=error)

    def purge_sent(self, older_than_seconds: float) -> int:
        cutoff = self.now - timedelta(seconds=older_than_seconds)
        gone = [oid for oid, o in self._t.outbox.items() if _lt(o["sent_at"], cutoff)]
        for oid in gone:
            del self._t.outbox[oid]
        return len(gone)

    def pending_count(self) -> int:
        return sum(1 for o in self._t.outbox.values() if o["sent_at"] is None)
