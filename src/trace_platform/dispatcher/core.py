"""The Dispatcher state machine: every task transition is one Postgres transaction.

queued -> running(attempt n, lease) -> succeeded | failed | canceled; a failed or reaped attempt
goes back to queued with capped, jittered backoff until max_attempts. Every wake-up is an
outbox row written in the same transaction as the state change (never a direct enqueue).
"""

from __future__ import annotations

import json
import math
import random
import uuid
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from trace_platform.config import Settings
from trace_platform.db.queries import Queries
from trace_platform.dispatcher import models as m
from trace_platform.dispatcher.dag_tasks import tasks_for_event
from trace_platform.dispatcher.errors import Conflict, Forbidden, Invalid, NotFound
from trace_platform.identity import Actor
from trace_platform.identity.vault import can_use_secret, vault_for
from trace_platform.queue import payloads

_Q = Queries("dispatcher")


def backoff_seconds(
    attempt: int, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Exponential in the attempt, capped, with jitter in [delay/2, delay] to spread retries."""
    delay = min(cap, base * (2 ** max(0, attempt - 1)))
    return (rng or random).uniform(delay / 2, delay)


STATE_CONFLICT = (
    "operator state changed while this attempt ran (another run of the job saved first); "
    "retrying on the newer state"
)


class Dispatcher:
    def __init__(self, pool: ConnectionPool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        self.queue = settings.task_queue

    # -- intent + outbox -----------------------------------------------------------------
    def _enqueue_wakeup(
        self, conn: Connection[Any], task_id: UUID, start_day: int, delay: float = 0
    ) -> None:
        payload = payloads.encode(payloads.TaskWakeup(task_id=task_id, start_day=start_day))
        conn.execute(
            _Q.insert_outbox,
            {
                "queue": self.queue,
                "payload": Jsonb(payload, dumps=lambda s: s),
                "delay": math.ceil(delay),
            },
        )

    def create_task(self, spec: m.TaskSpec, conn: Connection[Any] | None = None) -> m.TaskRef:
        """Task intent and its wake-up in one transaction (the caller's, if given)."""
        if len(json.dumps(spec.config, default=str)) > m.MAX_CONFIG_BYTES:
            raise Invalid(f"task config is larger than {m.MAX_CONFIG_BYTES} bytes")
        s = self.settings
        task_id = uuid.uuid4()
        params = {
            "task_id": task_id,
            "org_id": spec.org_id,
            "dag_id": spec.dag_id,
            "dag_version": spec.dag_version,
            "job": spec.job,
            "operator": spec.operator,
            "runtime": spec.runtime,
            "config": Jsonb(spec.config),
            "parent_task_id": spec.parent_task_id,
            "input_event_id": spec.input_event_id,
            "input_event": Jsonb(spec.input_event) if spec.input_event is not None else None,
            "input_versions": Jsonb([r.model_dump(mode="json") for r in spec.input_versions]),
            "outputs": Jsonb([r.model_dump(mode="json") for r in spec.outputs]),
            "run_id": spec.run_id,
            "worker_pool": spec.worker_pool,
            "max_concurrency": spec.max_concurrency,
            "timeout_seconds": spec.timeout_seconds or s.default_timeout_seconds,
            "max_attempts": spec.max_attempts or s.default_max_attempts,
            "retry_backoff_seconds": (
                spec.retry_backoff_seconds
                if spec.retry_backoff_seconds is not None
                else s.retry_backoff_seconds
            ),
            "retry_backoff_max_seconds": (
                spec.retry_backoff_max_seconds
                if spec.retry_backoff_max_seconds is not None
                else s.retry_backoff_max_seconds
            ),
        }

        def write(c: Connection[Any]) -> m.TaskRef:
            row = c.execute(_Q.insert_registry, params).fetchone()
            assert row is not None
            start_day = row["start_day"]
            c.execute(
                _Q.insert_status, {"task_id": task_id, "start_day": start_day, "status": "queued"}
            )
            self._enqueue_wakeup(c, task_id, start_day)
            return m.TaskRef(task_id=task_id, start_day=start_day, status="queued")

        if conn is not None:
            return write(conn)
        with self.pool.connection() as c, c.transaction():
            return write(c)

    # -- claim ---------------------------------------------------------------------------
    def claim(self, req: m.ClaimRequest) -> m.Claim:
        """Leases a queued task: one statement for a task without a worker pool; with one, the
        same statement plus a slot in one transaction (no slot, no claim)."""
        params = {
            "task_id": req.task_id,
            "worker_id": req.worker_id,
            "lease": self.settings.lease_seconds,
            "pooled": False,
        }
        with self.pool.connection() as conn:
            row = conn.execute(_Q.claim, params).fetchone()
        if row is not None:
            return m.Claim(**row, heartbeat_seconds=self.settings.heartbeat_seconds)
        with self.pool.connection() as conn, conn.transaction():
            row = conn.execute(_Q.claim, {**params, "pooled": True}).fetchone()
            if row is None:
                raise self._not_claimable(conn, req.task_id)
            slot = self._lease_slot(conn, req.task_id)  # raises (rolling back the claim) if none
        return m.Claim(**row, heartbeat_seconds=self.settings.heartbeat_seconds, slot=slot)

    # -- worker pools ----------------------------------------------------------------------
    def _lease_slot(self, conn: Connection[Any], task_id: UUID) -> m.SlotLease | None:
        """One slot of the job's pool, within min(max_concurrency, pool size)."""
        t = conn.execute(_Q.task_pool, {"task_id": task_id}).fetchone()
        if t is None or t["worker_pool"] is None:
            return None
        key = {"dag_id": t["dag_id"], "pool": t["worker_pool"], "job": t["job"]}
        conn.execute(_Q.lock_pool, key)  # serialises slot accounting per pool, not claims at large
        usage = conn.execute(_Q.pool_usage, key).fetchone()
        assert usage is not None
        if usage["job_running"] >= (t["max_concurrency"] or 1) or usage["free_slot"] is None:
            why = (
                f"job '{t['job']}' is at its max_concurrency ({t['max_concurrency']})"
                if usage["free_slot"] is not None
                else f"every slot of worker pool '{t['worker_pool']}' is in use"
            )
            raise Conflict(
                "waiting_for_slot", f"task {task_id} waits for a slot: {why}", pool=t["worker_pool"]
            )
        conn.execute(_Q.lease_slot, {**key, "task_id": task_id, "slot_index": usage["free_slot"]})
        return m.SlotLease(pool=t["worker_pool"], slot_index=usage["free_slot"])

    def _release_slot(self, conn: Connection[Any], task_id: UUID) -> None:
        """Every terminal path (and every retry) frees the slot and wakes a waiting task."""
        freed = conn.execute(_Q.release_slot, {"task_id": task_id}).fetchone()
        if freed is None:
            return
        for w in conn.execute(_Q.waiting_for_pool, {**freed, "limit": 2}).fetchall():
            if w["task_id"] != task_id:
                self._enqueue_wakeup(conn, w["task_id"], w["start_day"])

    def secrets(self, ref: m.LeaseRef) -> dict[str, str]:
        """The secret env of the task's slot, for the wrapper only (never logged). Each secret
        is checked again against the user who deployed the task's DAG version, as they are now
        (a revoked use_role refuses here, naming the secret); values are decrypted only here."""
        vault = vault_for(self.settings)
        with self.pool.connection() as conn:
            st = self._fenced(conn, ref)
            if st["status"] != "running":
                raise Conflict("lease_lost", f"task {ref.task_id} is {st['status']}")
            key = {"task_id": ref.task_id, "org_id": st["org_id"]}
            rows = conn.execute(_Q.slot_secret_values, key).fetchall()
            if not rows:
                return {}
            if any(r["legacy"] for r in rows):  # stored before 0008 and not yet sealed
                vault.seal_legacy(conn)
                rows = conn.execute(_Q.slot_secret_values, key).fetchall()
            who = conn.execute(
                _Q.task_deployer, {"task_id": ref.task_id, "start_day": st["start_day"]}
            ).fetchone()
        deployer = (
            Actor(
                who["user_id"], who["org_id"], who["name"], who["is_admin"], frozenset(who["roles"])
            )
            if who
            else None
        )
        values: dict[str, str] = {}
        for r in rows:
            if r["org_id"] is None:
                raise Forbidden(
                    f"secret '{r['name']}' named by the task's worker pool slot is not set"
                )
            if deployer is None or not can_use_secret(deployer, r):
                by = f"'{deployer.name}'" if deployer else "the task's deployer"
                raise Forbidden(
                    f"{by} (who deployed this DAG version) may no longer use secret "
                    f"'{r['name']}': not its owner, an admin, or in its use_roles"
                )
            values[r["env_var"]] = vault.open(r["org_id"], r["name"], r["ciphertext"])
        return values

    def _not_claimable(self, conn: Connection[Any], task_id: UUID) -> Exception:
        st = conn.execute(_Q.status, {"task_id": task_id}).fetchone()
        if st is None:
            return NotFound(f"task {task_id} does not exist")
        if st["status"] == "queued" and st["cancel_requested"]:
            reason = "cancel was requested"
        elif st["status"] == "queued":
            reason = f"it is backing off until {st['next_attempt_at'].isoformat()}"
        else:
            reason = f"it is {st['status']} (attempt {st['attempt']})"
        return Conflict(
            "not_claimable",
            f"task {task_id} cannot be claimed: {reason}",
            status=st["status"],
            attempt=st["attempt"],
        )

    # -- fencing -------------------------------------------------------------------------
    def _fenced(self, conn: Connection[Any], ref: m.LeaseRef) -> dict[str, Any]:
        """Locks the status row and checks the caller speaks for the current attempt."""
        return self._check_lease(
            conn.execute(_Q.status_for_update, {"task_id": ref.task_id}).fetchone(), ref
        )

    @staticmethod
    def _check_lease(row: dict[str, Any] | None, ref: m.LeaseRef) -> dict[str, Any]:
        if row is None:
            raise NotFound(f"task {ref.task_id} does not exist")
        if ref.attempt != row["attempt"]:
            raise Conflict(
                "stale_attempt",
                f"attempt {ref.attempt} of task {ref.task_id} is stale: "
                f"attempt {row['attempt']} has started",
                current_attempt=row["attempt"],
            )
        if row["lease_token"] is None or ref.lease_token != row["lease_token"]:
            raise Conflict(
                "wrong_lease",
                f"the lease token does not hold attempt {ref.attempt} of task {ref.task_id}",
            )
        return row

    @staticmethod
    def _reject_finished(st: dict[str, Any], ref: m.LeaseRef) -> None:
        if st["status"] in ("succeeded", "canceled"):
            raise Conflict(
                "task_finished",
                f"task {ref.task_id} is already {st['status']}; nothing more is accepted",
                status=st["status"],
            )

    # -- task-fetch and heartbeat -----------------------------------------------------------
    def fetch(self, ref: m.LeaseRef) -> m.TaskPayload:
        with self.pool.connection() as conn:
            view = self._check_lease(
                conn.execute(_Q.task_view, {"task_id": ref.task_id}).fetchone(), ref
            )
            slot = conn.execute(_Q.slot_of_task, {"task_id": ref.task_id}).fetchone()
            state, revision = None, 0
            if view["dag_id"] is not None:
                row = conn.execute(
                    _Q.operator_state,
                    {"org_id": view["org_id"], "dag_id": view["dag_id"], "job": view["job"]},
                ).fetchone()
                state, revision = (row["state"], row["revision"]) if row else (None, 0)
        status = "canceled" if view["cancel_requested"] else view["status"]
        return m.TaskPayload(
            task_id=view["task_id"],
            attempt=view["attempt"],
            start_day=view["start_day"],
            status=status,
            cancel_requested=view["cancel_requested"],
            org_id=view["org_id"],
            dag_id=view["dag_id"],
            dag_version=view["dag_version"],
            job=view["job"],
            operator=view["operator"],
            runtime=view["runtime"],
            config=view["config"],
            parent_task_id=view["parent_task_id"],
            input_event=view["input_event"],
            inputs=[m.DatasetRef(**r) for r in view["input_versions"]],
            outputs=[m.DatasetRef(**r) for r in view["outputs"]],
            run_id=view["run_id"],
            worker_pool=view["worker_pool"],
            slot_index=slot["slot_index"] if slot else None,
            slot_env=slot["env"] if slot else {},
            slot_secret_names=sorted(slot["secrets"]) if slot else [],
            operator_state=state,
            operator_state_revision=revision,
            idempotency=m.IdempotencyContext(
                producer_task_id=view["task_id"], attempt=view["attempt"]
            ),
            timeout_seconds=view["timeout_seconds"],
            deadline_at=view["deadline_at"],
            lease_until=view["lease_until"],
            heartbeat_seconds=self.settings.heartbeat_seconds,
        )

    def heartbeat(self, req: m.HeartbeatRequest) -> m.HeartbeatResponse:
        with self.pool.connection() as conn, conn.transaction():
            row = conn.execute(
                _Q.heartbeat,
                {
                    "task_id": req.task_id,
                    "attempt": req.attempt,
                    "lease_token": req.lease_token,
                    "lease": self.settings.lease_seconds,
                },
            ).fetchone()
            if row is not None:
                return m.HeartbeatResponse(**row)
            st = self._fenced(conn, req)
            raise Conflict(
                "lease_lost",
                f"attempt {req.attempt} of task {req.task_id} no longer holds its lease "
                f"(task is {st['status']})",
                status=st["status"],
            )

    # -- events and completion -----------------------------------------------------------
    @staticmethod
    def _check_outputs(st: dict[str, Any], dataset_uuids: list[UUID], what: str) -> dict[str, Any]:
        """A task speaks only for the datasets its own job produces in its dag_version (fixed
        when the task was created); a task with no outputs can emit and commit nothing."""
        outputs = {o["dataset_uuid"]: o for o in st["outputs"]}
        for ds in dataset_uuids:
            if str(ds) not in outputs:
                raise Forbidden(
                    f"{what} names dataset {ds}, which task {st['task_id']} does not produce "
                    f"(its outputs: {', '.join(outputs) or 'none'})"
                )
        return outputs

    def _commit_outputs(
        self, conn: Connection[Any], st: dict[str, Any], attempt: int, commits: list[m.OutputCommit]
    ) -> int:
        outputs = self._check_outputs(st, [c.dataset_uuid for c in commits], "an output commit")
        for c in commits:
            version = c.dataset_version or (outputs.get(str(c.dataset_uuid)) or {}).get(
                "dataset_version"
            )
            if version is None:
                raise Invalid(f"output commit for dataset {c.dataset_uuid} needs a dataset_version")
            conn.execute(
                _Q.insert_commit,
                {
                    "commit_id": uuid.uuid4(),
                    "dataset_uuid": c.dataset_uuid,
                    "dataset_version": version,
                    "task_id": st["task_id"],
                    "attempt": attempt,
                    "scope": c.scope,
                    "partition_key": c.partition_key,
                    "range_start": c.range.start if c.range else None,
                    "range_end": c.range.end if c.range else None,
                    "location": c.location,
                    "row_count": c.row_count,
                    "byte_count": c.byte_count,
                },
            )
        return len(commits)

    def _insert_events(
        self, conn: Connection[Any], st: dict[str, Any], attempt: int, events: list[m.EventIn]
    ) -> tuple[list[UUID], int, int]:
        """Stores new events and, in the same transaction, creates the tasks they start."""
        if not events:
            return [], 0, 0
        self._check_outputs(st, [e.dataset_uuid for e in events], "an event")
        params = [
            {
                "event_id": uuid.uuid4(),
                "start_day": st["start_day"],
                "org_id": st["org_id"],
                "task_id": st["task_id"],
                "attempt": attempt,
                "dataset_uuid": ev.dataset_uuid,
                "dedupe_key": ev.dedupe_key,
                "cursor": ev.cursor,
                "partition_key": ev.partition_key,
                "range_start": ev.range.start if ev.range else None,
                "range_end": ev.range.end if ev.range else None,
                "payload": Jsonb(ev.payload),
            }
            for ev in events
        ]
        accepted: list[UUID] = []
        created = 0
        with conn.cursor() as cur:
            cur.executemany(_Q.insert_event, params, returning=True)
            rows = []
            while True:
                rows.append(cur.fetchone())
                if not cur.nextset():
                    break
        for ev, row in zip(events, rows, strict=True):
            if row is None:  # a duplicate returns nothing and starts nothing
                continue
            accepted.append(row["event_id"])
            for spec in tasks_for_event(
                conn, org_id=st["org_id"], producer=st, event_id=row["event_id"], event=ev
            ):
                self.create_task(spec, conn)
                created += 1
        return accepted, len(events) - len(accepted), created

    def events(self, req: m.EventsRequest) -> m.EventsResponse:
        with self.pool.connection() as conn, conn.transaction():
            st = self._fenced(conn, req)
            self._reject_finished(st, req)
            ids, dups, created = self._insert_events(conn, st, req.attempt, req.events)
        return m.EventsResponse(
            accepted=len(ids), duplicates=dups, event_ids=ids, tasks_created=created
        )

    @staticmethod
    def _state_conflicts(conn: Any, task_id: Any) -> int:
        row = conn.execute(
            _Q.state_conflicts, {"task_id": task_id, "error": STATE_CONFLICT}
        ).fetchone()
        return int(row["n"]) if row else 0

    @staticmethod
    def _state_moved(conn: Any, st: dict[str, Any], read_revision: int) -> bool:
        key = {"org_id": st["org_id"], "dag_id": st["dag_id"], "job": st["job"]}
        conn.execute(_Q.lock_operator_state, key)
        row = conn.execute(_Q.operator_state, key).fetchone()
        return (row["revision"] if row else 0) != read_revision

    def complete(self, req: m.CompleteRequest) -> m.CompleteResponse:
        """Accepted only for the current attempt of a task not succeeded/canceled; a late
        report of the current attempt (after its lease expired) is accepted too."""
        if (
            req.outcome == "succeeded"
            and not req.final_events
            and not req.outputs
            and req.operator_state is None
        ):
            fast = {"task_id": req.task_id, "attempt": req.attempt, "lease_token": req.lease_token}
            with self.pool.connection() as conn:
                if conn.execute(_Q.complete_fast, fast).fetchone() is not None:
                    return m.CompleteResponse(
                        task_id=req.task_id, attempt=req.attempt, status="succeeded"
                    )
        with self.pool.connection() as conn, conn.transaction():
            st = self._fenced(conn, req)
            key = {"task_id": req.task_id, "start_day": st["start_day"], "attempt": req.attempt}
            if st["status"] in ("succeeded", "canceled"):
                if st["status"] == req.outcome:  # the same report again: idempotent
                    return m.CompleteResponse(
                        task_id=req.task_id, attempt=req.attempt, status=st["status"]
                    )
                self._reject_finished(st, req)
            conflict = False
            if req.outcome == "succeeded" and req.operator_state is not None:
                if st["dag_id"] is None:
                    raise Invalid("operator state is kept per DAG job; this task has no DAG")
                if conflict := self._state_moved(conn, st, req.operator_state_revision):
                    # Another run of this job saved state since this attempt read it: nothing
                    # of this attempt lands, and it runs again on the newer state.
                    req = req.model_copy(
                        update={
                            "outcome": "failed",
                            "retryable": True,
                            "error": STATE_CONFLICT,
                            "final_events": [],
                            "outputs": [],
                            "operator_state": None,
                        }
                    )
            ids, dups, created = self._insert_events(conn, st, req.attempt, req.final_events)
            committed = self._commit_outputs(conn, st, req.attempt, req.outputs)
            self._release_slot(conn, req.task_id)
            next_at: datetime | None = None
            if req.outcome == "succeeded":
                conn.execute(_Q.set_succeeded, {"task_id": req.task_id})
                if req.operator_state is not None:
                    conn.execute(
                        _Q.save_operator_state,
                        {
                            "org_id": st["org_id"],
                            "dag_id": st["dag_id"],
                            "job": st["job"],
                            "state": Jsonb(req.operator_state),
                            "task_id": req.task_id,
                        },
                    )
                conn.execute(_Q.finish_attempt, {**key, "outcome": "succeeded", "error": None})
                status = "succeeded"
            elif req.outcome == "canceled":
                conn.execute(
                    _Q.set_terminal, {"task_id": req.task_id, "status": "canceled", "error": None}
                )
                conn.execute(_Q.finish_attempt, {**key, "outcome": "canceled", "error": None})
                status = "canceled"
            else:
                error = req.error or "operator failed without a message"
                conn.execute(_Q.finish_attempt, {**key, "outcome": "failed", "error": error})
                if st["status"] != "running":
                    # A late failure report: the reaper already decided this attempt's fate.
                    status = st["status"]
                elif conflict and not st["cancel_requested"]:
                    # Someone else made progress: not this task's failure, so it costs no
                    # retry budget and waits only a moment (jittered, so racers spread out).
                    next_at = self._schedule_retry(conn, st, error, random.uniform(0.05, 0.5))
                    status = "queued"
                elif (
                    req.retryable
                    and not st["cancel_requested"]
                    and req.attempt - self._state_conflicts(conn, req.task_id) < st["max_attempts"]
                ):
                    next_at = self._schedule_retry(conn, st, error)
                    status = "queued"
                else:
                    final = "canceled" if st["cancel_requested"] else "failed"
                    conn.execute(
                        _Q.set_terminal, {"task_id": req.task_id, "status": final, "error": error}
                    )
                    status = final
        return m.CompleteResponse(
            task_id=req.task_id,
            attempt=req.attempt,
            status=status,
            next_attempt_at=next_at,
            events_accepted=len(ids),
            events_duplicate=dups,
            tasks_created=created,
            outputs_committed=committed,
        )

    def _schedule_retry(
        self, conn: Connection[Any], st: dict[str, Any], error: str, delay: float | None = None
    ) -> datetime:
        if delay is None:
            delay = backoff_seconds(
                st["attempt"], st["retry_backoff_seconds"], st["retry_backoff_max_seconds"]
            )
        row = conn.execute(
            _Q.set_retry, {"task_id": st["task_id"], "error": error, "backoff": delay}
        ).fetchone()
        assert row is not None
        self._enqueue_wakeup(conn, st["task_id"], st["start_day"], delay)
        return row["next_attempt_at"]

    # -- reaper --------------------------------------------------------------------------
    def reap(self, limit: int = 100) -> int:
        """Fails attempts whose lease or deadline expired; retries or finishes their tasks.
        Safe to run in many processes at once (SKIP LOCKED)."""
        with self.pool.connection() as conn, conn.transaction():
            rows = conn.execute(_Q.expired_leases, {"limit": limit}).fetchall()
            for st in rows:
                outcome = "timed_out" if st["timed_out"] else "lease_expired"
                error = (
                    f"attempt {st['attempt']} exceeded its timeout"
                    if st["timed_out"]
                    else f"attempt {st['attempt']} lost its lease (missed heartbeats)"
                )
                conn.execute(
                    _Q.finish_attempt,
                    {
                        "task_id": st["task_id"],
                        "start_day": st["start_day"],
                        "attempt": st["attempt"],
                        "outcome": outcome,
                        "error": error,
                    },
                )
                self._release_slot(conn, st["task_id"])
                if st["cancel_requested"]:
                    conn.execute(
                        _Q.set_terminal,
                        {"task_id": st["task_id"], "status": "canceled", "error": error},
                    )
                elif st["attempt"] < st["max_attempts"]:
                    self._schedule_retry(conn, st, error)
                else:
                    conn.execute(
                        _Q.set_terminal,
                        {"task_id": st["task_id"], "status": "failed", "error": error},
                    )
        return len(rows)

    def rewake(self, after_seconds: float, limit: int = 500) -> int:
        """Anti-entropy: a fresh wake-up for queued tasks left untouched for `after_seconds`."""
        with self.pool.connection() as conn, conn.transaction():
            rows = conn.execute(
                _Q.stranded_queued, {"after": after_seconds, "limit": limit}
            ).fetchall()
            for r in rows:
                self._enqueue_wakeup(conn, r["task_id"], r["start_day"])
            if rows:
                conn.execute(_Q.touch, {"ids": [r["task_id"] for r in rows]})
        return len(rows)

    # -- user-facing ---------------------------------------------------------------------
    def cancel(self, task_id: UUID) -> m.CancelResponse:
        with self.pool.connection() as conn, conn.transaction():
            row = conn.execute(_Q.request_cancel, {"task_id": task_id}).fetchone()
            if row is not None:
                return m.CancelResponse(task_id=task_id, **row)
            st = conn.execute(_Q.status, {"task_id": task_id}).fetchone()
            if st is None:
                raise NotFound(f"task {task_id} does not exist")
            if st["status"] == "canceled":
                return m.CancelResponse(task_id=task_id, status="canceled", cancel_requested=True)
            raise Conflict(
                "task_finished",
                f"task {task_id} already {st['status']}; it cannot be canceled",
                status=st["status"],
            )

    def get_task(self, task_id: UUID) -> m.TaskView:
        with self.pool.connection() as conn:
            v = conn.execute(_Q.task_view, {"task_id": task_id}).fetchone()
            if v is None:
                raise NotFound(f"task {task_id} does not exist")
            key = {"task_id": task_id, "start_day": v["start_day"]}
            attempts = conn.execute(_Q.task_attempts, key).fetchall()
            n_events = conn.execute(_Q.task_event_count, key).fetchone()
        return m.TaskView(
            **{k: v[k] for k in m.TaskView.model_fields if k in v},
            attempts=[m.AttemptView(**a) for a in attempts],
            events=n_events["n"] if n_events else 0,
        )

    def list_tasks(self, limit: int = 50) -> list[dict[str, Any]]:
        with self.pool.connection() as conn:
            return conn.execute(_Q.list_tasks, {"limit": limit}).fetchall()
