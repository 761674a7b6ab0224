"""Operator state per (org, dag, job, lineage), saved by compare-and-set: a success carries the revision
its attempt read, and lands only if no other run of the job saved since. An attempt that lost
that race ends with its own outcome, `state_conflict`: someone else made progress, so it runs
again on the newer state and costs no retry budget."""

from __future__ import annotations

from typing import Any

from trace_platform.store.tasks import StateKey, StoreTx, TaskKey

OUTCOME = "state_conflict"
STATE_CONFLICT = (
    "operator state changed while this attempt ran (another run of the job saved first); "
    "retrying on the newer state"
)


def _key(task: dict[str, Any]) -> StateKey:
    return StateKey(
        org_id=task["org_id"],
        dag_id=task["dag_id"],
        dag_version=task["dag_version"],
        job=task["job"],
    )


def read(tx: StoreTx, task: dict[str, Any]) -> tuple[Any, int]:
    """The job's state and its revision (None and 0 before the first save, or with no DAG)."""
    if task["dag_id"] is None:
        return None, 0
    row = tx.operator_state(_key(task))
    return (row["state"], row["revision"]) if row else (None, 0)


def moved(tx: StoreTx, st: dict[str, Any], read_revision: int) -> bool:
    """Takes the job's state lock (held to the end of the transaction) and tells whether another
    run saved since `read_revision` was read."""
    key = _key(st)
    tx.lock_operator_state(key)
    row = tx.operator_state(key)
    return (row["revision"] if row else 0) != read_revision


def save(tx: StoreTx, st: dict[str, Any], state: Any) -> None:
    tx.save_operator_state(_key(st), state, st["task_id"])


def untried(tx: StoreTx, st: dict[str, Any]) -> int:
    """How many of the task's attempts are not tries: lost a state race, or handed back by a
    worker shutting down."""
    return tx.untried_attempts(TaskKey(task_id=st["task_id"], start_day=st["start_day"]))


def tries_left(tx: StoreTx, st: dict[str, Any], attempt: int) -> bool:
    """Whether the task may run again after `attempt` within its max_attempts, attempts that
    are not tries (`untried`) not counting. Their count is read only when the attempt number
    alone would exhaust the budget."""
    budget = int(st["max_attempts"])
    return attempt < budget or attempt - untried(tx, st) < budget
