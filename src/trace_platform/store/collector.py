"""The state store's `collector` calls (`db/sql/collector.sql`)."""

from __future__ import annotations

from uuid import UUID

from psycopg import Cursor

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("collector")


class CollectorStore(Calls):
    """The calls of `db/sql/collector.sql`, each with its parameters by name and type, on the
    caller's connection (inside the caller's transaction); each returns its cursor."""

    def expire_pins(self) -> Cursor[Row]:
        """Pins whose query can no longer be running (its process died before it released them)."""
        return self._run(_Q.expire_pins)

    def collectable(self, *, grace: float, batch: int) -> Cursor[Row]:
        """Retired locations nothing can reach any more, locked for this run: retired at least
        `grace` ago, before the snapshot of every live query pin (a query pinned earlier
        may be reading them), and never a location any commit still references: neither
        the location itself, nor one under it, nor one above it (a Parquet location is a
        '/'-ended prefix; a table is a name)."""
        return self._run(_Q.collectable, {"grace": grace, "batch": batch})

    def mark_deleted(self, *, ids: list[int]) -> Cursor[Row]:
        return self._run(_Q.mark_deleted, {"ids": ids})

    def mark_refused(self, *, id: int, reason: str) -> Cursor[Row]:
        return self._run(_Q.mark_refused, {"id": id, "reason": reason})

    def collectable_batches(
        self, *, grace: float, dead_retention: float, batch: int
    ) -> Cursor[Row]:
        """Settled buffer batches whose artifact may go, locked for this run: loaded at least
        `grace` ago, or dead at least `dead_retention` ago; never one whose artifact another
        record still needs."""
        return self._run(
            _Q.collectable_batches,
            {"grace": grace, "dead_retention": dead_retention, "batch": batch},
        )

    def mark_batches_collected(self, *, ids: list[UUID]) -> Cursor[Row]:
        return self._run(_Q.mark_batches_collected, {"ids": ids})

    def mark_batch_refused(self, *, record_id: UUID, reason: str) -> Cursor[Row]:
        return self._run(_Q.mark_batch_refused, {"record_id": record_id, "reason": reason})
