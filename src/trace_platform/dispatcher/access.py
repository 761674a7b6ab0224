"""Read access, checked again where a task is made and where it is claimed: a DAG reads another
DAG's dataset on behalf of the user who deployed it, as that user's roles and the dataset's
read_roles are now (a deploy-time check alone would let a revoked reader go on for ever)."""

from __future__ import annotations

from uuid import UUID

from trace_platform.identity import actor_from_row, can_read_row
from trace_platform.store.tasks import StoreTx


def refused_read(tx: StoreTx, task_id: UUID) -> str | None:
    """Why the task may not read one of its inputs (None: it may read them all)."""
    inputs = tx.foreign_inputs(task_id)
    if not inputs:
        return None
    who = tx.task_deployer_any_day(task_id)
    if who is None:
        return "the task's DAG version has no deployer to read its inputs as"
    deployer = actor_from_row(who)
    for ds in inputs:
        if not can_read_row(deployer, ds):  # the row carries its producer's owner and roles
            return (
                f"403 forbidden: '{deployer.name}' (who deployed version {who['dag_version']} "
                f"of DAG '{who['dag']}') may no longer read dataset '{ds['dataset_name']}' "
                "(not in its read_roles)"
            )
    return None


def fail_if_refused(tx: StoreTx, task_id: UUID) -> str | None:
    """Ends a not yet started task failed when it may not read an input; returns why."""
    reason = refused_read(tx, task_id)
    if reason is not None:
        tx.fail_unstarted(task_id, reason)
    return reason
