"""What an attempt reads, resolved at task-fetch: the committed locations of its inputs (a
retry or replay writes new, attempt-scoped keys, so a reader must follow the commit, never list
a range's prefix) and its outputs' update strategies."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from trace_platform.contract import (
    ChainIdentity,
    CommittedScope,
    DatasetRef,
    RangeSpec,
    scope_key,
)
from trace_platform.operators import WHOLE_INPUT_OPERATORS
from trace_platform.store.tasks import ReadsParams, StoreTx


def _event_scope(event: dict[str, Any]) -> tuple[str | None, RangeSpec | None]:
    rng = RangeSpec(**event["range"]) if event.get("range") else None
    pk = event.get("partition_key")
    if rng is None and pk is None:
        return None, None  # a cursor or a trigger firing names no committed scope
    return scope_key(pk, rng), rng


def strategy_rows(tx: StoreTx, outputs: list[list[dict[str, Any]]]) -> dict[Any, dict[str, Any]]:
    """The update strategies of every output version of several tasks (`outputs`: each one's
    outputs), read in one query (none when no task has a versioned output), by version."""
    versions = sorted(
        {
            UUID(str(o["dataset_version"]))
            for out in outputs
            for o in out
            if o.get("dataset_version")
        }
    )
    return {r["dataset_version"]: r for r in tx.output_strategies(versions)} if versions else {}


def outputs_with_strategies(
    tx: StoreTx,
    outputs: list[dict[str, Any]],
    by_version: dict[Any, dict[str, Any]] | None = None,
) -> list[DatasetRef]:
    """The task's outputs with their update strategies (`by_version`: already read)."""
    refs = [DatasetRef(**r) for r in outputs]
    if by_version is None:
        by_version = strategy_rows(tx, [outputs])
    for ref in refs:
        row = by_version.get(ref.dataset_version)
        if row is not None:
            ref.update_strategy = row["update_strategy"]
            ref.unique_key = list(row["unique_key"]) or None
    return refs


def committed_reads(
    tx: StoreTx, view: dict[str, Any], outputs: list[DatasetRef]
) -> list[CommittedScope]:
    event = view["input_event"] or {}
    scope, rng = _event_scope(event)
    whole_reader = view["operator"] in WHOLE_INPUT_OPERATORS
    scoped: list[UUID] = []
    whole: list[UUID] = []
    for r in view["input_versions"]:
        version = r.get("dataset_version")
        if version is None:
            continue
        if whole_reader:
            whole.append(version)
        elif scope is not None and str(r["dataset_uuid"]) == str(event.get("dataset_uuid")):
            scoped.append(version)
    appends = [
        o.dataset_version
        for o in outputs
        if rng is not None and o.update_strategy == "append" and o.unique_key and o.dataset_version
    ]
    own = [o.dataset_version for o in outputs if scope is not None and o.dataset_version]
    if not (scoped or whole or appends or own):
        return []
    rows = tx.committed_reads(
        ReadsParams(
            scoped=scoped,
            whole=whole,
            appends=appends,
            own=own,
            scope=scope,
            range_start=rng.start if rng else None,
            range_end=rng.end if rng else None,
        )
    )
    return [
        CommittedScope(
            dataset_uuid=r["dataset_uuid"],
            dataset_version=r["dataset_version"],
            scope=r["scope"],
            range=RangeSpec(start=r["range_start"], end=r["range_end"])
            if r["range_start"] is not None and r["range_end"] is not None
            else None,
            location=r["location"],
            chain=ChainIdentity(
                chain_id=r["chain_id"],
                first_hash=r["first_block_hash"],
                parent_hash=r["parent_hash"],
                last_hash=r["last_block_hash"],
            )
            if r["chain_id"] is not None
            else None,
        )
        for r in rows
    ]
