"""Events, output commits, the reads they allow and the operator state a task saves, on the
in-memory tables, as `db/sql/dispatcher.sql` and `reads.sql` do."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any
from uuid import UUID

from trace_platform.contract import EventIn, TaskSpec
from trace_platform.store.tasks.memory.tables import (
    _BLOCK_HASH,
    _COMMITTED_READ,
    ConstraintViolation,
    _coalesce,
    _eq,
    _jsonb,
    _lt,
    _pick,
    _uuid,
)
from trace_platform.store.tasks.memory.tx_base import TxBase
from trace_platform.store.tasks.params import NewCommit, NewEvent, ReadsParams, StateKey
from trace_platform.store.tasks.protocol import Row


class CommitCalls(TxBase):
    """Read access, operator state, events, commits and committed reads."""

    def foreign_inputs(self, task_id: UUID) -> list[Row]:
        return []  # no producer DAGs for datasets

    def task_deployer_any_day(self, task_id: UUID) -> Row | None:
        return None  # no DAG versions or users

    # -- operator state ---------------------------------------------------------------------
    @staticmethod
    def _state_key(key: StateKey) -> tuple[UUID, UUID, str, int]:
        # Lineage: coalesce(since_version from dag_version_jobs, 0), and memory has no jobs.
        return (key.org_id, key.dag_id, key.job, 0)

    def operator_state(self, key: StateKey) -> Row | None:
        row = self._t.operator_state.get(self._state_key(key))
        return _pick(row, ("state", "revision")) if row is not None else None

    def lock_operator_state(self, key: StateKey) -> None:
        pass  # the store lock already serialises transactions

    def save_operator_state(self, key: StateKey, state: Any, task_id: UUID) -> None:
        k = self._state_key(key)
        row = self._t.operator_state.get(k)
        if row is not None:
            row.update(
                state=_jsonb(state),
                updated_by_task=task_id,
                updated_at=self.now,
                revision=row["revision"] + 1,
            )
            return
        self._t.operator_state[k] = {
            "org_id": key.org_id,
            "dag_id": key.dag_id,
            "job": key.job,
            "lineage": k[3],
            "state": _jsonb(state),
            "updated_by_task": task_id,
            "updated_at": self.now,
            "revision": 1,
        }

    # -- events, commits and reads ----------------------------------------------------------
    def insert_events(self, events: list[NewEvent]) -> list[UUID | None]:
        ids: list[UUID | None] = []
        for given in events:  # one at a time: a duplicate within the batch is a duplicate too
            e = replace(  # uuid columns cast text, as Postgres does
                given,
                event_id=_uuid(given.event_id),
                org_id=_uuid(given.org_id),
                task_id=_uuid(given.task_id),
                dataset_uuid=_uuid(given.dataset_uuid),
            )
            dedupe = (e.start_day, e.task_id, e.dataset_uuid, e.dedupe_key)
            if dedupe in self._t.event_keys:  # ON CONFLICT (...) DO NOTHING
                ids.append(None)
                continue
            pk = (e.start_day, e.event_id)
            if pk in self._t.events:  # not the arbiter: Postgres raises
                raise ConstraintViolation(f"events_pkey: event {e.event_id} exists")
            self._t.events[pk] = {
                "event_id": e.event_id,
                "start_day": e.start_day,
                "org_id": e.org_id,
                "producer_task_id": e.task_id,
                "producer_attempt": e.attempt,
                "dataset_uuid": e.dataset_uuid,
                "dedupe_key": e.dedupe_key,
                "cursor": e.cursor,
                "partition_key": e.partition_key,
                "range_start": e.range_start,
                "range_end": e.range_end,
                "payload": _jsonb(e.payload),
                "created_at": self.now,
            }
            self._t.event_keys[dedupe] = pk
            ids.append(e.event_id)
        return ids

    def tasks_for_event(
        self, *, org_id: UUID, producer: Row, event_id: UUID, event: EventIn, invalidates: bool
    ) -> list[tuple[TaskSpec, str]]:
        return []  # no DAG subscriptions in memory

    def insert_commit(self, c: NewCommit) -> str | None:
        # A version named by a task's outputs comes from JSON, as text: Postgres casts it.
        c = replace(
            c,
            commit_id=_uuid(c.commit_id),
            dataset_uuid=_uuid(c.dataset_uuid),
            dataset_version=_uuid(c.dataset_version),
            task_id=_uuid(c.task_id),
        )
        for h in (c.first_block_hash, c.last_block_hash, c.parent_hash):
            if h is not None and not _BLOCK_HASH.fullmatch(h):
                raise ConstraintViolation(f"dataset_commits hash check: {h!r}")
        key = (c.dataset_version, c.scope)
        old = self._t.dataset_commits.get(key)
        old_location = old["location"] if old is not None else None
        if old is not None:
            # ON CONFLICT DO UPDATE: commit_id, dataset_uuid, partition_key and the range stay.
            old.update(
                task_id=c.task_id,
                attempt=c.attempt,
                location=c.location,
                dag_version=c.dag_version,
                row_count=c.row_count,
                byte_count=c.byte_count,
                created_at=self.now,
                chain_id=c.chain_id,
                first_block_hash=c.first_block_hash,
                last_block_hash=c.last_block_hash,
                parent_hash=c.parent_hash,
            )
        else:
            if c.dataset_uuid not in self._t.datasets:
                raise ConstraintViolation(f"dataset_commits: no dataset {c.dataset_uuid}")
            if c.dataset_version not in self._t.dataset_versions:
                raise ConstraintViolation(f"dataset_commits: no version {c.dataset_version}")
            if any(r["commit_id"] == c.commit_id for r in self._t.dataset_commits.values()):
                raise ConstraintViolation(f"dataset_commits_pkey: commit {c.commit_id} exists")
            self._t.dataset_commits[key] = {
                "commit_id": c.commit_id,
                "dataset_uuid": c.dataset_uuid,
                "dataset_version": c.dataset_version,
                "task_id": c.task_id,
                "attempt": c.attempt,
                "scope": c.scope,
                "partition_key": c.partition_key,
                "range_start": c.range_start,
                "range_end": c.range_end,
                "location": c.location,
                "row_count": c.row_count,
                "byte_count": c.byte_count,
                "created_at": self.now,
                "dag_version": c.dag_version,
                "chain_id": c.chain_id,
                "first_block_hash": c.first_block_hash,
                "last_block_hash": c.last_block_hash,
                "parent_hash": c.parent_hash,
            }
        # A row comes back only when a location was replaced and so retired: the scope had a
        # non-null location distinct from the new one (and the dataset exists, the join's).
        ds = self._t.datasets.get(c.dataset_uuid)
        if old_location is None or old_location == c.location or ds is None:
            return None
        version = self._t.dataset_versions.get(c.dataset_version)
        self._t.retired_locations.append(
            {
                "id": next(self.store._retired_ids),
                "org_id": ds["org_id"],
                "backend": _coalesce(version["backend"] if version else None, ds["backend"]),
                "location": old_location,
                "reason": "superseded",
                "retired_at": self.now,
                "deleted_at": None,
            }
        )
        # The RETURNING sub-select: the version's strategy, else its dataset's (the version's
        # own dataset, joined by USING); NULL without a version row.
        if version is None:
            return None
        own = self._t.datasets.get(version["dataset_uuid"])
        if own is None:
            return None
        strategy: str | None = _coalesce(version["update_strategy"], own["update_strategy"])
        return strategy

    def existing_versions(self, versions: list[str]) -> set[str]:
        wanted = {_uuid(v) for v in versions}
        return {str(v) for v in self._t.dataset_versions if v in wanted}

    def output_strategies(self, versions: list[UUID]) -> list[Row]:
        wanted = {_uuid(v) for v in versions}
        rows: list[Row] = []
        for v in self._t.dataset_versions.values():
            d = self._t.datasets.get(v["dataset_uuid"])
            if v["dataset_version"] not in wanted or d is None:
                continue
            unique_key = _coalesce(v["unique_key"], d["unique_key"])
            rows.append(
                {
                    "dataset_version": v["dataset_version"],
                    "update_strategy": _coalesce(v["update_strategy"], d["update_strategy"]),
                    "unique_key": copy.deepcopy(unique_key),
                }
            )
        return rows

    def committed_reads(self, p: ReadsParams) -> list[Row]:
        scoped = {_uuid(v) for v in p.scoped}
        whole = {_uuid(v) for v in p.whole}
        appends = {_uuid(v) for v in p.appends}
        own = {_uuid(v) for v in p.own}

        def read(c: Row) -> bool:
            v, scope = c["dataset_version"], c["scope"]
            return (
                (v in scoped and _eq(scope, p.scope))
                or v in whole
                or (
                    v in appends
                    and p.scope is not None
                    and scope != p.scope
                    and _lt(c["range_start"], p.range_end)
                    and _lt(p.range_start, c["range_end"])
                )
                or (v in own and _eq(scope, p.scope))
            )

        rows = [
            c for c in self._t.dataset_commits.values() if c["location"] is not None and read(c)
        ]
        # Postgres sorts uuids by their bytes (as UUID compares) and text byte-wise (locale C).
        rows.sort(key=lambda c: (c["dataset_version"], c["scope"]))
        return [_pick(c, _COMMITTED_READ) for c in rows]
