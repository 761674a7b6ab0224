"""Worker-pool slots: a pooled task runs only while it holds one slot of its job's pool, within
min(max_concurrency, pool size); every terminal path and every retry frees the slot and wakes a
task waiting for it. A slot's secrets are opened for the wrapper of the task holding it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

from trace_platform.config import Settings
from trace_platform.contract import LeaseRef, SlotLease
from trace_platform.dag.whole import implicit_pool
from trace_platform.dispatcher.fencing import fenced
from trace_platform.dispatcher.intents import Intents
from trace_platform.errors import Conflict, Forbidden
from trace_platform.identity import actor_from_row
from trace_platform.identity.vault import can_use_secret, vault_for
from trace_platform.operators import WHOLE_OUTPUT_OPERATORS
from trace_platform.store.tasks import (
    PoolJob,
    PoolKey,
    Row,
    SlotLeaseParams,
    StateStore,
    StoreTx,
    TaskKey,
)


class Slots:
    def __init__(self, store: StateStore, settings: Settings, intents: Intents) -> None:
        self.store = store
        self.settings = settings
        self.intents = intents
        self.vault = vault_for(settings)  # the key is read once, not on every task's fetch

    def lease(self, tx: StoreTx, task_id: UUID) -> SlotLease | None:
        """One slot of the job's pool, within min(max_concurrency, pool size)."""
        t = tx.task_pool(task_id)
        if t is None or t["worker_pool"] is None:
            return None
        key = PoolJob(dag_id=t["dag_id"], pool=t["worker_pool"], job=t["job"])
        # Serialises slot accounting per pool, not claims at large.
        tx.lock_pool(PoolKey(dag_id=key.dag_id, pool=key.pool))
        whole = t["operator"] in WHOLE_OUTPUT_OPERATORS
        if whole:
            # A whole writer runs one at a time in its DAG, not only in its pool: a deploy may
            # have moved it to another pool while a run held a slot of the old one. Its claims
            # in every pool take one more lock (its implicit pool's, always after their own),
            # so two of them never both find the job idle.
            tx.lock_pool(PoolKey(dag_id=key.dag_id, pool=implicit_pool(key.job)))
        usage = tx.pool_usage(key)
        held = whole and usage["job_running_in_dag"] > 0  # a run of it holds a slot somewhere
        at_limit = usage["job_running"] >= (t["max_concurrency"] or 1)
        if held or at_limit or usage["free_slot"] is None:
            raise Conflict(
                "waiting_for_slot",
                f"task {task_id} waits for a slot: {_why_waiting(t, held, usage['free_slot'])}",
                pool=t["worker_pool"],
            )
        tx.lease_slot(
            SlotLeaseParams(
                dag_id=key.dag_id,
                pool=key.pool,
                job=key.job,
                task_id=task_id,
                slot_index=usage["free_slot"],
                whole=whole,
            )
        )
        return SlotLease(pool=t["worker_pool"], slot_index=usage["free_slot"])

    def release(self, tx: StoreTx, task_id: UUID) -> None:
        """Every terminal path (and every retry) frees the slot and wakes the waiting tasks
        that can take the pool's free slots (never one its job's max_concurrency holds back)."""
        freed = tx.release_slot(task_id)
        if freed is not None:
            # The task itself, if retried at once, has a wake-up of its own.
            wake_in_place_of(
                tx, self.intents, [(freed.pool, freed.job if freed.whole else None)], task_id
            )

    def canceled_waiting(self, tx: StoreTx, task_id: UUID) -> None:
        """A pooled task canceled while it waited may have been one a release woke: the tasks
        that can take its place are woken (see `wake_in_place_of`)."""
        t = tx.task_pool(task_id)
        if t is None or t["worker_pool"] is None:
            return
        whole = t["job"] if t["operator"] in WHOLE_OUTPUT_OPERATORS else None
        wake_in_place_of(
            tx, self.intents, [(PoolKey(dag_id=t["dag_id"], pool=t["worker_pool"]), whole)]
        )

    def secrets(self, ref: LeaseRef) -> dict[str, str]:
        """The secret env of the task's slot, for the wrapper only (never logged). Each secret
        is checked again against the user who deployed the task's DAG version, as they are now
        (a revoked use_role refuses here, naming the secret); values are decrypted only here."""
        vault = self.vault
        with self.store.transaction() as tx:
            st = fenced(tx, ref)
            if st["status"] != "running":
                raise Conflict("lease_lost", f"task {ref.task_id} is {st['status']}")
            rows = tx.slot_secret_values(ref.task_id, st["org_id"])
            if not rows:
                return {}
            if any(r["legacy"] for r in rows):  # stored before 0008 and not yet sealed
                tx.seal_legacy_secrets(vault)
                rows = tx.slot_secret_values(ref.task_id, st["org_id"])
            who = tx.task_deployer(TaskKey(task_id=ref.task_id, start_day=st["start_day"]))
        deployer = actor_from_row(who) if who else None
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


def wake_in_place_of(
    tx: StoreTx | Any,
    intents: Intents,
    freed: Iterable[tuple[PoolKey, str | None]],
    woken_already: UUID | None = None,
) -> None:
    """Wakes the tasks that can take the place of a pooled task that ran or was woken: each
    (pool, whole writer's job or None) is a slot released, or a waiting task canceled (a
    release wakes only as many tasks as the pool has free slots, and a whole writer's one next
    run: one canceled before it claimed would leave a slot idle until the rewake). A whole
    writer's next run is its job's oldest that can claim now, in whichever pool a deploy left
    it: one run, never one per pool (only one can claim); the pool's slots go to the other
    jobs' tasks. Each pool and job is looked up once, however many of its tasks are named;
    `woken_already`, a task with a wake-up of its own, is not woken again."""
    store = intents.store.adopt(tx)
    freed = list(dict.fromkeys(freed))
    # Taken as a claim takes them (its pool, then a whole writer's job-wide one), so this
    # reads what a racing release or cancel of the same pool committed: a cancel racing the
    # release that woke its task still passes the slot on (each waits for the other).
    for key in _locks(freed):
        store.lock_pool(key)
    woken: dict[UUID, None] = {}
    for pool, whole in freed:
        for waiting in store.waiting_for_pool(pool, skip_job=whole):
            woken[waiting] = None
        if whole is not None:
            for waiting in store.waiting_for_job(pool.dag_id, whole):
                woken[waiting] = None
    if woken_already is not None:
        woken.pop(woken_already, None)
    for waiting in woken:
        intents.wake(store, waiting)


def _locks(freed: list[tuple[PoolKey, str | None]]) -> list[PoolKey]:
    """The pool locks `wake_in_place_of` takes: the pools, then the whole writers' implicit
    ones (a job-wide lock, see `Slots.lease`), each once, in a stable order."""
    pools = sorted({p for p, _ in freed}, key=lambda k: (str(k.dag_id), k.pool))
    jobs = {PoolKey(dag_id=p.dag_id, pool=implicit_pool(w)) for p, w in freed if w is not None}
    return pools + sorted(jobs - set(pools), key=lambda k: (str(k.dag_id), k.pool))


def _why_waiting(t: Row, held: bool, free_slot: int | None) -> str:
    if held:
        return f"job '{t['job']}' rewrites its output whole and runs one at a time"
    if free_slot is not None:
        return f"job '{t['job']}' is at its max_concurrency ({t['max_concurrency']})"
    return f"every slot of worker pool '{t['worker_pool']}' is in use"
