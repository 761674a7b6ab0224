"""The worker registry: which workers are alive, on which hosts, running what.

A worker registers on start, beats on a thread of its own every `beat_seconds`
(worker/membership.py) and marks itself stopped on a clean exit, all through the internal API
(a worker on another host reaches nothing else). The reaper (`reap_dead`) declares a worker
whose last beat is older than DEAD_AFTER_BEATS of its intervals dead and, in the same
transaction, ends its running attempts as a lapsed lease is ended (`Lifecycle.fail_holders`):
they are retried by their tasks' own policies at once, instead of when their leases run out.
Their lease tokens are cleared, so whatever that worker still sends for them (a heartbeat, an
event, a completion) lands nothing, and a dead worker stays dead: its beats and its
re-registration are refused (it exits, and a new process registers under a new id).

Postgres only (the in-memory twin has no registry): the lifecycle it calls is the store's."""

from __future__ import annotations

import logging
import math
from typing import Any
from uuid import UUID

from trace_platform.contract_fleet import (
    DEAD_AFTER_BEATS,
    WorkerBeat,
    WorkerRegistration,
    WorkerState,
    WorkerView,
)
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.errors import Conflict, NotFound
from trace_platform.store.tasks.postgres import PostgresStore, PostgresTx
from trace_platform.store.workers import WorkerStore

log = logging.getLogger(__name__)
# An ended (stopped or dead) worker stays listed this long, then is deleted.
KEEP_ENDED_SECONDS = 7 * 86400.0


class WorkerRegistry:
    def __init__(self, dispatcher: Dispatcher) -> None:
        if not isinstance(dispatcher.store, PostgresStore):
            raise TypeError("the worker registry needs the Postgres state store")
        self.dispatcher = dispatcher
        self.store = dispatcher.store

    @classmethod
    def of(cls, dispatcher: Dispatcher) -> WorkerRegistry | None:
        """The registry of a Dispatcher on Postgres; None for the in-memory twin."""
        return cls(dispatcher) if isinstance(dispatcher.store, PostgresStore) else None

    # -- the workers' calls ----------------------------------------------------------------
    def register(self, req: WorkerRegistration) -> WorkerBeat:
        with self.store.pool.connection() as conn:
            row = WorkerStore(conn).register(**req.model_dump()).fetchone()
            if row is None:
                self._refuse(WorkerStore(conn), req.worker_id, req)
        return _beat(row)

    def beat(self, worker_id: str) -> WorkerBeat:
        with self.store.pool.connection() as conn:
            row = WorkerStore(conn).beat(worker_id=worker_id).fetchone()
            if row is None:
                self._refuse(WorkerStore(conn), worker_id)
        return _beat(row)

    def stop(self, worker_id: str) -> WorkerBeat:
        """A clean exit. Stopping a stopped worker again answers the same (its answer may have
        been lost); a dead one stays dead."""
        with self.store.pool.connection() as conn:
            store = WorkerStore(conn)
            row = store.stop(worker_id=worker_id).fetchone()
            if row is None:
                row = store.worker(worker_id=worker_id).fetchone()
                if row is None or row["state"] != "stopped":
                    self._refuse(store, worker_id)
        return _beat(row)

    @staticmethod
    def _refuse(store: WorkerStore, worker_id: str, req: WorkerRegistration | None = None) -> Any:
        """Why a worker's call changed nothing, as the error it gets."""
        row = store.worker(worker_id=worker_id).fetchone()
        if row is None:
            raise NotFound(
                f"worker {worker_id} is not registered (register it first)", worker_id=worker_id
            )
        state: WorkerState = row["state"]
        if state == "dead":
            raise Conflict(
                "worker_dead",
                f"worker {worker_id} was declared dead ({row['ended_reason']}); its attempts "
                "were ended and retried: stop, and start again as a new worker",
                worker_id=worker_id,
            )
        if state == "stopped":
            raise Conflict(
                "worker_stopped",
                f"worker {worker_id} stopped; a worker that starts again registers a new id",
                worker_id=worker_id,
            )
        assert req is not None  # an alive row takes every beat and stop
        raise Conflict(
            "worker_id_taken",
            f"worker id {worker_id} is registered by {row['host']} pid {row['pid']}, not "
            f"{req.host} pid {req.pid}",
            worker_id=worker_id,
        )

    # -- the reaper's ----------------------------------------------------------------------
    def reap_dead(self, watched_seconds: float = math.inf) -> int:
        """Declares dead every alive worker silent for DEAD_AFTER_BEATS of its beats and
        ends its running attempts, in one transaction: the attempts it ended.
        `watched_seconds`: how long the caller has been watching the registry without a gap
        (run_reaper's); a worker is judged only on a silence that long at most, since no beat
        could land while the caller (the API) or the database was away."""
        with self.store.transaction() as tx:
            assert isinstance(tx, PostgresTx)
            dead = (
                WorkerStore(tx.conn)
                .mark_dead(beats=DEAD_AFTER_BEATS, watched=watched_seconds)
                .fetchall()
            )
            if not dead:
                return 0
            ended = self.dispatcher.fail_holders(
                tx, {r["worker_id"]: r["ended_reason"] for r in dead}
            )
        self.dispatcher.metrics.workers_dead.inc(len(dead))  # counted once committed
        self.dispatcher.metrics.reaped.labels("worker_dead").inc(ended)
        for r in dead:
            log.warning(
                "worker %s on %s declared dead: %s", r["worker_id"], r["host"], r["ended_reason"]
            )
        if ended:
            log.warning("ended %d running attempt(s) of dead workers; retried", ended)
        return ended

    def prune(self, keep_seconds: float = KEEP_ENDED_SECONDS) -> int:
        with self.store.pool.connection() as conn:
            return WorkerStore(conn).prune(keep=keep_seconds).rowcount

    # -- the listing -----------------------------------------------------------------------
    def list(
        self, org_id: UUID, state: WorkerState | None = None, limit: int = 100
    ) -> list[WorkerView]:
        """The fleet as `org_id` sees it: every worker, its running tasks of that org alone."""
        with self.store.pool.connection() as conn:
            rows = (
                WorkerStore(conn).list_workers(org_id=org_id, state=state, limit=limit).fetchall()
            )
        return [WorkerView(**r) for r in rows]


def _beat(row: dict[str, Any]) -> WorkerBeat:
    return WorkerBeat(
        worker_id=row["worker_id"],
        state=row["state"],
        beat_seconds=row["beat_seconds"],
        dead_after_seconds=DEAD_AFTER_BEATS * row["beat_seconds"],
    )
