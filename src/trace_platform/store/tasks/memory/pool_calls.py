"""Worker pools and their slots on the in-memory tables, as `db/sql/dispatcher.sql`'s queries
do: a slot leased and released, who waits for one, a slot's secrets (none here)."""

from __future__ import annotations

from collections import Counter
from typing import Any
from uuid import UUID

from trace_platform.store.tasks.memory.tables import ConstraintViolation, _eq, _json_text, _pick
from trace_platform.store.tasks.memory.tx_base import TxBase
from trace_platform.store.tasks.params import FreedSlot, PoolJob, PoolKey, SlotLeaseParams, TaskKey
from trace_platform.store.tasks.protocol import Row


class PoolCalls(TxBase):
    """Worker-pool slots: leased, released, waited for."""

    def task_pool(self, task_id: UUID) -> Row | None:
        r = self._t.task_registry.get(task_id)
        return (
            _pick(r, ("dag_id", "worker_pool", "max_concurrency", "job", "operator")) if r else None
        )

    def lock_pool(self, key: PoolKey) -> None:
        pass  # the store lock already serialises transactions

    def _pool(self, dag_id: UUID, pool: str) -> list[Row]:
        return [
            slot
            for slot in self._t.pool_slots.values()
            if slot["dag_id"] == dag_id and slot["pool"] == pool
        ]

    @staticmethod
    def _free_slots(slots: list[Row]) -> list[int]:
        """The free slots a claim may take: live ones, or a dropped pool's retired ones (as
        dispatcher.sql's pool_usage)."""
        dropped = all(s["retired"] for s in slots)
        return [
            s["slot_index"]
            for s in slots
            if s["leased_by_task"] is None and s["retired"] == dropped
        ]

    def _whole_held(self, dag_id: UUID) -> Counter[str]:
        """Slots whole-writer runs hold in any pool of the DAG, by job."""
        return Counter(
            s["leased_job"]
            for s in self._t.pool_slots.values()
            if s["dag_id"] == dag_id and s["leased_whole"]
        )

    def pool_usage(self, key: PoolJob) -> Row:
        slots = self._pool(key.dag_id, key.pool)
        free = self._free_slots(slots)
        return {
            "job_running": sum(1 for s in slots if _eq(s["leased_job"], key.job)),
            "job_running_in_dag": self._whole_held(key.dag_id)[key.job],
            "free_slot": min(free) if free else None,
        }

    def lease_slot(self, p: SlotLeaseParams) -> None:
        slot = self._t.pool_slots.get((p.dag_id, p.pool, p.slot_index))
        if slot is None or slot["leased_by_task"] is not None:
            return
        if self._slot_of(p.task_id) is not None:  # pool_slots_task_idx: one slot per task
            raise ConstraintViolation(f"pool_slots_task_idx: task {p.task_id} holds a slot")
        slot.update(
            leased_by_task=p.task_id, leased_job=p.job, leased_at=self.now, leased_whole=p.whole
        )

    def release_slot(self, task_id: UUID) -> FreedSlot | None:
        slot = self._slot_of(task_id)
        if slot is None:
            return None
        freed = FreedSlot(
            PoolKey(slot["dag_id"], slot["pool"]), slot["leased_job"], slot["leased_whole"]
        )
        slot.update(leased_by_task=None, leased_job=None, leased_at=None, leased_whole=False)
        return freed

    def waiting_for_pool(self, key: PoolKey, skip_job: str | None = None) -> list[UUID]:
        slots = self._pool(key.dag_id, key.pool)
        leased: dict[str, int] = {}
        for slot in slots:
            if slot["leased_by_task"] is not None and slot["leased_job"] is not None:
                leased[slot["leased_job"]] = leased.get(slot["leased_job"], 0) + 1
        free = len(self._free_slots(slots))
        whole_held = self._whole_held(key.dag_id)
        waiting = [
            (s, r)
            for s, r in self._joined()
            if _eq(r["dag_id"], key.dag_id)
            and _eq(r["worker_pool"], key.pool)
            and s["status"] == "queued"
            and not s["cancel_requested"]
            and s["next_attempt_at"] <= self.now
            and (skip_job is None or s.get("whole_job") != skip_job)
            and not self._dag_paused(r["dag_id"])
        ]
        waiting.sort(key=lambda sr: sr[0]["updated_at"])  # stable: ties keep insertion order
        places: dict[str, int] = {}
        eligible: list[UUID] = []
        for s, r in waiting:
            # row_number() OVER (PARTITION BY job ORDER BY updated_at) <= the job's room
            places[r["job"]] = places.get(r["job"], 0) + 1
            limit = r["max_concurrency"] if r["max_concurrency"] is not None else 1
            room = limit - leased.get(r["job"], 0)
            if s.get("whole_job") is not None:  # held in any pool of the DAG: no room
                room = min(room, 1 - whole_held[s["whole_job"]])
            if places[r["job"]] <= room:
                eligible.append(s["task_id"])
        return eligible[:free]

    def waiting_for_job(self, dag_id: UUID, job: str) -> list[UUID]:
        if self._whole_held(dag_id)[job]:
            return []

        def can_claim(r: Row) -> bool:  # a free slot of its pool, within its max_concurrency
            usage = self.pool_usage(PoolJob(dag_id, r["worker_pool"], job))
            limit = r["max_concurrency"] if r["max_concurrency"] is not None else 1
            return usage["free_slot"] is not None and usage["job_running"] < limit

        waiting = [
            s
            for s, r in self._joined()
            if _eq(r["dag_id"], dag_id)
            and r["worker_pool"] is not None
            and _eq(s.get("whole_job"), job)
            and s["status"] == "queued"
            and not s["cancel_requested"]
            and s["next_attempt_at"] <= self.now
            and not self._dag_paused(r["dag_id"])
            and can_claim(r)
        ]
        waiting.sort(key=lambda s: s["updated_at"])  # stable: ties keep insertion order
        return [s["task_id"] for s in waiting[:1]]

    def slot_of_task(self, task_id: UUID) -> Row | None:
        slot = self._slot_of(task_id)
        return _pick(slot, ("pool", "slot_index", "env", "secrets")) if slot else None

    def slot_secret_values(self, task_id: UUID, org_id: UUID) -> list[Row]:
        slot = self._slot_of(task_id)
        if slot is None:
            return []
        # No secrets table: every name misses the LEFT JOIN, so its columns are all NULL
        # (org_id NULL: "not set") and legacy (`legacy_value IS NOT NULL`) is false.
        return [
            {
                "env_var": env_var,
                "name": _json_text(name),
                "org_id": None,
                "owner_user_id": None,
                "use_roles": None,
                "ciphertext": None,
                "legacy": False,
            }
            for env_var, name in sorted(slot["secrets"].items())
        ]

    def seal_legacy_secrets(self, vault: Any) -> int:
        return 0  # no secrets, so none stored before encryption

    def task_deployer(self, key: TaskKey) -> Row | None:
        return None  # no DAG versions or users
