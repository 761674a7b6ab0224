"""The state store on Postgres: each call is one named query of `db/sql/dispatcher.sql`,
`outbox.sql` or `reads.sql`, its typed parameters turned into the query's parameter dict."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any
from uuid import UUID

import psycopg
from psycopg import Connection
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from trace_platform.cache import LruCache
from trace_platform.contract import EventIn, TaskSpec
from trace_platform.db.pool import make_pool
from trace_platform.db.queries import Queries, literal_limit
from trace_platform.dispatcher.dag_tasks import tasks_for_event
from trace_platform.store.tasks.params import (
    AttemptEnd,
    ClaimManyParams,
    ClaimParams,
    FreedSlot,
    HeartbeatParams,
    LeaseCheck,
    NewCommit,
    NewEvent,
    NewTask,
    PoolJob,
    PoolKey,
    ReadsParams,
    RetryParams,
    RunRetryParams,
    SlotLeaseParams,
    StateKey,
    TaskKey,
    Wakeup,
    fields,
)
from trace_platform.store.tasks.protocol import Row

_Q = Queries("dispatcher")
# A task's registry row never changes (only its status row does), and its task_id is unique
# across databases, so its worker-pool fields are cached for the process, never invalidated:
# the lookup names no start_day and would probe every partition of the registry otherwise.
TASK_POOLS: LruCache[UUID, Row] = LruCache("task_registry_pool", 50_000)
# The plan settings of the Dispatcher's store transactions (see PostgresStore.transaction). A
# generic plan is kept for the connection, so:
#  * no sequential scans: one made while a table held a handful of rows (a new install, once
#    autovacuum analysed it) read the whole table later, wherever it had found a seq scan
#    cheaper than the index: every keyed statement (a heartbeat, a claim, a completion) read
#    all of its partition's tasks until the next ANALYZE replaced the plan. Every statement
#    here reads by key or off an index.
#  * no JIT: a generic plan prices each unnest()ed array at 10 elements, and a statement over
#    a few large dataset versions (committed_reads) crossed jit_above_cost: 250 ms of
#    compiling, on every run, for a read of two rows.
_PLAN_SETTINGS = {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off", "jit": "off"}
# As session settings of a pool of the store's own (PostgresStore.connect)...
DISPATCHER_OPTIONS = " ".join(f"-c {k}={v}" for k, v in _PLAN_SETTINGS.items())
# ...or set in each transaction, in one statement, on a pool shared with other work.
DISPATCHER_PLANS = "SELECT " + ", ".join(
    f"set_config('{k}', '{v}', true)" for k, v in _PLAN_SETTINGS.items()
)
_OUTBOX = Queries("outbox")
_READS = Queries("reads")


def _json(value: Any) -> Jsonb | None:
    return Jsonb(value) if value is not None else None


def _ids(value: Any) -> str:
    """UUIDs as JSON text; anything else not JSON is refused (as Jsonb refuses it)."""
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class PostgresTx:
    """One transaction's calls on a connection (the caller owns the transaction)."""

    def __init__(self, conn: Connection[Any]) -> None:
        self.conn = conn

    def _one(self, query: str, params: dict[str, Any] | None = None) -> Row | None:
        return self.conn.execute(query, params).fetchone()

    def _all(self, query: str, params: dict[str, Any] | None = None) -> list[Row]:
        return self.conn.execute(query, params).fetchall()

    # -- tasks ------------------------------------------------------------------------------
    def insert_tasks(self, ps: list[NewTask]) -> list[int]:
        if not ps:
            return []
        rows = json.dumps([{**fields(p), "n": i} for i, p in enumerate(ps)], default=_ids)
        got = self._all(_Q.insert_tasks, {"rows": rows})
        return [int(r["start_day"]) for r in got]

    def status(self, task_id: UUID) -> Row | None:
        return self._one(_Q.status, {"task_id": task_id})

    def status_for_update(self, task_id: UUID) -> Row | None:
        return self._one(_Q.status_for_update, {"task_id": task_id})

    def task_view(self, task_id: UUID) -> Row | None:
        return self._one(_Q.task_view, {"task_id": task_id})

    def task_attempts(self, key: TaskKey) -> list[Row]:
        return self._all(_Q.task_attempts, fields(key))

    def task_event_count(self, key: TaskKey) -> int:
        row = self._one(_Q.task_event_count, fields(key))
        return int(row["n"]) if row else 0

    def list_tasks(self, limit: int) -> list[Row]:
        return self._all(literal_limit(_Q.list_tasks, limit))

    def task_dag_paused(self, task_id: UUID) -> Row | None:
        return self._one(_Q.task_dag_paused, {"task_id": task_id})

    def lock_task_dag_shared(self, task_id: UUID) -> None:
        self.conn.execute(_Q.lock_task_dag_shared, {"task_id": task_id})

    def lock_dag_shared(self, dag_id: UUID) -> None:
        self.conn.execute(_Q.lock_dag_shared, {"dag_id": dag_id})

    # -- the lease --------------------------------------------------------------------------
    def claim(self, p: ClaimParams) -> Row | None:
        return self._one(_Q.claim, fields(p))

    def claim_many(self, p: ClaimManyParams) -> list[Row]:
        return self._all(_Q.claim_many, fields(p))

    def heartbeat(self, p: HeartbeatParams) -> Row | None:
        # The batch's statement for one: one statement guards the plan (see heartbeat_many).
        return self.heartbeat_many([p]).get(p.task_id)

    def heartbeat_many(self, beats: list[HeartbeatParams]) -> dict[UUID, Row]:
        if not beats:
            return {}
        # In task_id order, as complete_fast_many: two API processes' batches then lock their
        # common rows in one order whatever plan the statement takes (no deadlock).
        beats = sorted(beats, key=lambda b: b.task_id)
        rows = self._all(
            _Q.heartbeat_many,
            {
                "task_ids": [b.task_id for b in beats],
                "attempts": [b.attempt for b in beats],
                "lease_tokens": [b.lease_token for b in beats],
                "progress": [_json(b.progress) for b in beats],
                "lease": beats[0].lease,
            },
        )
        return {r.pop("task_id"): r for r in rows}

    def complete_fast(self, p: LeaseCheck) -> bool:
        return self._one(_Q.complete_fast, fields(p)) is not None

    def complete_fast_many(self, checks: list[LeaseCheck]) -> set[UUID]:
        if not checks:
            return set()
        # Sent in task_id order too (the statement locks rows in its input's order): Python
        # orders UUIDs as Postgres does, by their bytes.
        checks = sorted(checks, key=lambda c: c.task_id)
        rows = self._all(
            _Q.complete_fast_many,
            {
                "task_ids": [c.task_id for c in checks],
                "attempts": [c.attempt for c in checks],
                "lease_tokens": [c.lease_token for c in checks],
            },
        )
        return {r["task_id"] for r in rows}

    def finish_attempt(self, p: AttemptEnd) -> None:
        self.conn.execute(_Q.finish_attempt, fields(p))

    def set_succeeded(self, task_id: UUID) -> None:
        self.conn.execute(_Q.set_succeeded, {"task_id": task_id})

    def set_terminal(self, task_id: UUID, status: str, error: str | None) -> None:
        self.conn.execute(_Q.set_terminal, {"task_id": task_id, "status": status, "error": error})

    def set_retry(self, p: RetryParams) -> Row:
        row = self._one(_Q.set_retry, fields(p))
        assert row is not None, f"task {p.task_id} has no status row"
        return row

    def request_cancel(self, task_ids: list[UUID]) -> dict[UUID, Row]:
        rows = self._all(_Q.request_cancel, {"task_ids": sorted(task_ids)})
        return {r.pop("task_id"): r for r in rows}

    def expired_leases(self, limit: int, leases: bool = True) -> list[Row]:
        return self._all(_Q.expired_leases, {"limit": limit, "leases": leases})

    def revoke_worker_leases(self, worker_ids: list[str]) -> list[Row]:
        return self._all(_Q.revoke_worker_leases, {"worker_ids": worker_ids})

    def untried_attempts(self, key: TaskKey) -> int:
        row = self._one(_Q.untried_attempts, fields(key))
        return int(row["n"]) if row else 0

    def retry_failed(self, p: RunRetryParams) -> list[Row]:
        return self._all(_Q.retry_failed, fields(p))

    def fail_unstarted(self, task_id: UUID, error: str) -> None:
        self.conn.execute(_Q.fail_unstarted, {"task_id": task_id, "error": error})

    def stranded_queued(self, after_seconds: float, limit: int) -> list[Row]:
        return self._all(_Q.stranded_queued, {"after": after_seconds, "limit": limit})

    def touch(self, task_ids: list[UUID]) -> None:
        self.conn.execute(_Q.touch, {"ids": task_ids})

    # -- the outbox -------------------------------------------------------------------------
    def insert_outbox(self, w: Wakeup) -> None:
        self.conn.execute(
            _Q.insert_outbox,
            {"queue": w.queue, "payload": Jsonb(w.payload, dumps=lambda s: s), "delay": w.delay},
        )

    def insert_task_wakeup(self, task_id: UUID, w: Wakeup, by_runtime: dict[str, str]) -> None:
        self.conn.execute(
            _Q.insert_task_wakeup,
            {
                "task_id": task_id,
                "queues": Jsonb(by_runtime),
                "queue": w.queue,
                "payload": Jsonb(w.payload, dumps=lambda s: s),
                "delay": w.delay,
            },
        )

    def insert_outbox_many(self, ws: list[Wakeup]) -> None:
        if ws:
            self.conn.execute(
                _Q.insert_outbox_many,
                {
                    "queues": [w.queue for w in ws],
                    "payloads": [w.payload for w in ws],
                    "delays": [w.delay for w in ws],
                },
            )

    def claim_pending(self, limit: int) -> list[Row]:
        return self._all(_OUTBOX.claim_pending, {"limit": limit})

    def mark_sent(self, ids: list[int]) -> None:
        self.conn.execute(_OUTBOX.mark_sent, {"ids": ids})

    def mark_failed(self, ids: list[int], error: str) -> None:
        self.conn.execute(_OUTBOX.mark_failed, {"ids": ids, "error": error})

    def purge_sent(self, older_than_seconds: float) -> int:
        return self.conn.execute(_OUTBOX.purge_sent, {"older_than": older_than_seconds}).rowcount

    def pending_count(self) -> int:
        row = self._one(_OUTBOX.pending_count)
        return int(row["n"]) if row else 0

    # -- worker-pool slots ------------------------------------------------------------------
    def task_pool(self, task_id: UUID) -> Row | None:
        row = TASK_POOLS.get(task_id)
        if row is None:
            row = self._one(_Q.task_pool, {"task_id": task_id})
            if row is not None:  # a task not (yet) there is not remembered as absent
                TASK_POOLS.put(task_id, row)
        return dict(row) if row is not None else None

    def lock_pool(self, key: PoolKey) -> None:
        self.conn.execute(_Q.lock_pool, fields(key))

    def pool_usage(self, key: PoolJob) -> Row:
        row = self._one(_Q.pool_usage, fields(key))
        assert row is not None
        return row

    def lease_slot(self, p: SlotLeaseParams) -> None:
        self.conn.execute(_Q.lease_slot, fields(p))

    def release_slot(self, task_id: UUID) -> FreedSlot | None:
        row = self._one(_Q.release_slot, {"task_id": task_id})
        if row is None:
            return None
        return FreedSlot(PoolKey(row["dag_id"], row["pool"]), row["job"], row["whole"])

    def waiting_for_pool(self, key: PoolKey, skip_job: str | None = None) -> list[UUID]:
        rows = self._all(_Q.waiting_for_pool, {**fields(key), "skip_job": skip_job})
        return [r["task_id"] for r in rows]

    def waiting_for_job(self, dag_id: UUID, job: str) -> list[UUID]:
        rows = self._all(_Q.waiting_for_job, {"dag_id": dag_id, "job": job})
        return [r["task_id"] for r in rows]

    def slot_of_task(self, task_id: UUID) -> Row | None:
        return self._one(_Q.slot_of_task, {"task_id": task_id})

    def slot_secret_values(self, task_id: UUID, org_id: UUID) -> list[Row]:
        return self._all(_Q.slot_secret_values, {"task_id": task_id, "org_id": org_id})

    def seal_legacy_secrets(self, vault: Any) -> int:
        return int(vault.seal_legacy(self.conn))

    def task_deployer(self, key: TaskKey) -> Row | None:
        return self._one(_Q.task_deployer, fields(key))

    # -- read access ------------------------------------------------------------------------
    def foreign_inputs(self, task_id: UUID) -> list[Row]:
        return self._all(_Q.foreign_inputs, {"task_id": task_id})

    def task_deployer_any_day(self, task_id: UUID) -> Row | None:
        return self._one(_Q.task_deployer_any_day, {"task_id": task_id})

    # -- operator state ---------------------------------------------------------------------
    def operator_state(self, key: StateKey) -> Row | None:
        return self._one(_Q.operator_state, fields(key))

    def lock_operator_state(self, key: StateKey) -> None:
        self.conn.execute(_Q.lock_operator_state, fields(key))

    def save_operator_state(self, key: StateKey, state: Any, task_id: UUID) -> None:
        self.conn.execute(
            _Q.save_operator_state, {**fields(key), "state": Jsonb(state), "task_id": task_id}
        )

    # -- events, commits and reads ----------------------------------------------------------
    def insert_events(self, events: list[NewEvent]) -> list[UUID | None]:
        if not events:
            return []
        params = [{**fields(e), "payload": Jsonb(e.payload)} for e in events]
        ids: list[UUID | None] = []
        with self.conn.cursor() as cur:
            cur.executemany(_Q.insert_event, params, returning=True)
            while True:
                row = cur.fetchone()
                ids.append(row["event_id"] if row else None)
                if not cur.nextset():
                    break
        return ids

    def tasks_for_event(
        self, *, org_id: UUID, producer: Row, event_id: UUID, event: EventIn, invalidates: bool
    ) -> list[tuple[TaskSpec, str]]:
        return list(
            tasks_for_event(
                self.conn,
                org_id=org_id,
                producer=producer,
                event_id=event_id,
                event=event,
                invalidates=invalidates,
            )
        )

    def insert_commit(self, c: NewCommit) -> str | None:
        row = self._one(_Q.insert_commit, fields(c))
        return row["update_strategy"] if row else None

    def existing_versions(self, versions: list[str]) -> set[str]:
        rows = self._all(_Q.existing_versions, {"versions": versions})
        return {str(r["dataset_version"]) for r in rows}

    def output_strategies(self, versions: list[UUID]) -> list[Row]:
        return self._all(_READS.output_strategies, {"versions": versions})

    def committed_reads(self, p: ReadsParams) -> list[Row]:
        return self._all(_READS.committed_reads, fields(p))


class PostgresStore:
    def __init__(self, pool: ConnectionPool, *, planned: bool = False) -> None:
        """`planned`: the pool's sessions already carry the plan settings (`connect`)."""
        self.pool = pool
        self.planned = planned

    @classmethod
    def connect(cls, dsn: str, *, max_size: int) -> PostgresStore:
        """The store on a pool of its own, whose sessions carry the plan settings: each
        transaction then spends no round trip on them (measured end to end at 2 x 8 wrappers,
        in interleaved pairs: about 10-15% more tasks/s, 1-5 fewer context switches per task)."""
        pool = make_pool(
            dsn, max_size=max_size, name="trace-dispatcher", options=DISPATCHER_OPTIONS
        )
        return cls(pool, planned=True)

    @contextmanager
    def transaction(self) -> Iterator[PostgresTx]:
        with self.pool.connection() as conn, conn.transaction():
            # The Dispatcher's statements (claims, completions, intents: rows found by key)
            # are planned once: Postgres otherwise re-plans each prepared one on every run
            # (see db.pool.GENERIC_PLANS; measured: the in-process lifecycle 1.3-1.6x faster).
            # Only for the store, not on a pool shared with other work: elsewhere (listings,
            # ad hoc reads) a generic plan may be far worse than a custom one. No sequential
            # scans either (_PLAN_SETTINGS).
            if not self.planned:
                conn.execute(DISPATCHER_PLANS)
            yield PostgresTx(conn)

    @contextmanager
    def statement(self) -> Iterator[PostgresTx]:
        """Calls on a connection in autocommit: each statement its own transaction, one round
        trip instead of three (BEGIN, it, COMMIT). Only on a planned pool (its sessions carry
        the plan settings); otherwise a transaction, which sets them."""
        if not self.planned:
            with self.transaction() as tx:
                yield tx
            return
        with self.pool.connection() as conn:
            conn.autocommit = True
            try:
                yield PostgresTx(conn)
            finally:
                with suppress(psycopg.Error):  # a broken connection: the pool drops it
                    conn.autocommit = False  # as the pool hands its connections out

    def adopt(self, conn: Any) -> PostgresTx:
        return conn if isinstance(conn, PostgresTx) else PostgresTx(conn)

    def ensure_partitions(self) -> int:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT trace_ensure_partitions() AS n").fetchone()
            return int(row["n"]) if row else 0
