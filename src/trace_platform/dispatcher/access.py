"""Read access, checked again where a task is made and where it is claimed: a DAG reads another
DAG's dataset on behalf of the user who deployed it, as that user's roles and the dataset's
read_roles are now (a deploy-time check alone would let a revoked reader go on for ever)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg import Connection

from trace_platform.db.queries import Queries
from trace_platform.identity import actor_from_row, can_read_row

_Q = Queries("dispatcher")


def refused_read(conn: Connection[Any], task_id: UUID) -> str | None:
    """Why the task may not read one of its inputs (None: it may read them all)."""
    inputs = conn.execute(_Q.foreign_inputs, {"task_id": task_id}).fetchall()
    if not inputs:
        return None
    who = conn.execute(_Q.task_deployer_any_day, {"task_id": task_id}).fetchone()
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


def fail_if_refused(conn: Connection[Any], task_id: UUID) -> str | None:
    """Ends a not yet started task failed when it may not read an input; returns why."""
    reason = refused_read(conn, task_id)
    if reason is not None:
        conn.execute(_Q.fail_unstarted, {"task_id": task_id, "error": reason})
    return reason
