"""Fencing: a worker's call counts only if it speaks for the task's current attempt and holds
that attempt's lease token; an older attempt is refused once a newer one started."""

from __future__ import annotations

from typing import Any

from trace_platform.contract import CompleteRequest, LeaseRef
from trace_platform.errors import Conflict, NotFound
from trace_platform.store.tasks import StoreTx


def fenced(tx: StoreTx, ref: LeaseRef) -> dict[str, Any]:
    """Locks the status row and checks the caller speaks for the current attempt."""
    return check_lease(tx.status_for_update(ref.task_id), ref)


def check_lease(row: dict[str, Any] | None, ref: LeaseRef) -> dict[str, Any]:
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


def reject_finished(st: dict[str, Any], ref: LeaseRef) -> None:
    if st["status"] in ("succeeded", "canceled"):
        raise Conflict(
            "task_finished",
            f"task {ref.task_id} is already {st['status']}; nothing more is accepted",
            status=st["status"],
        )


def withdraw(
    st: dict[str, Any], req: CompleteRequest, purged: list[str] | None = None
) -> CompleteRequest:
    """A success that may no longer land lands nothing: it ends canceled, without its events,
    outputs or state. Either the task is withdrawn (its DAG version was rolled back or
    abandoned, and its job is not the live version's), so a rolled-back version never commits
    again; or an admin purged an output version it writes (`purged`)."""
    if req.outcome != "succeeded" or not (st.get("withdrawn") or purged):
        return req
    why = (
        f"DAG version {st['dag_version']} was {st['version_state'].replace('_', ' ')}"
        if st.get("withdrawn")
        else f"output version{'s' if len(purged or []) > 1 else ''} {', '.join(purged or [])} "
        "purged since the task was made"
    )
    return req.model_copy(
        update={
            "outcome": "canceled",
            "error": why,
            "final_events": [],
            "outputs": [],
            "operator_state": None,
        }
    )


def reject_withdrawn(st: dict[str, Any], ref: LeaseRef) -> None:
    if st.get("withdrawn"):
        raise Conflict(
            "version_withdrawn",
            f"task {ref.task_id} belongs to DAG version {st['dag_version']}, which was "
            f"{st['version_state'].replace('_', ' ')}; nothing more is accepted",
            status=st["status"],
        )
