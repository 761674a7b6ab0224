"""Buffered datasets at deploy: the ones a DAG declares are registered (once: their columns
and key never change, their rows stay through every deploy and rollback), and every job that
publishes to one must be among its writers, else the whole deploy is refused (403) and
nothing of it is stored. The deploy runs `register`, then the platform's alert datasets'
registration (alerts.datasets, which makes its datasets through `create` here), then
`check_writers`."""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.types.json import Jsonb

from trace_platform.dag.schema import DagSpec
from trace_platform.dag.validate import DagProblem
from trace_platform.identity import Actor, Forbidden
from trace_platform.layout import buffer_queue, dataset_location, version_location
from trace_platform.registry import names
from trace_platform.store.buffers import BufferStore
from trace_platform.store.registry import RegistryStore


def register(
    conn: Connection[Any],
    actor: Actor | None,
    spec: DagSpec,
    *,
    org_id: UUID,
    dag_id: UUID,
    version: int,
    max_batch_bytes: int,
) -> list[DagProblem]:
    """Registers the DAG's buffered datasets and checks its jobs' buffer outputs, in the
    deploy's transaction. `actor` None: a cutover or rollback (declarations were checked at
    deploy; writers are checked again at every publish). `max_batch_bytes`: the most a batch
    may be on this platform (the shared sink's bound, TRACE_SINK_MAX_BATCH_BYTES)."""
    problems: list[DagProblem] = []
    for i, b in enumerate(spec.buffered):
        at = f"buffered[{i}]"
        if b.max_bytes > max_batch_bytes:
            problems.append(
                DagProblem(
                    f"{at}.max_bytes",
                    f"{b.max_bytes} is over this platform's limit of {max_batch_bytes} bytes "
                    "a batch (TRACE_SINK_MAX_BATCH_BYTES)",
                )
            )
        columns = [c.model_dump() for c in b.columns]
        row = BufferStore(conn).buffered_by_name(org_id=org_id, name=b.name).fetchone()
        if row is not None:
            if row["owner_dag_id"] != dag_id:
                problems.append(DagProblem(f"{at}.name", f"'{b.name}' is declared by another DAG"))
            elif row["columns"] != columns or list(row["unique_key"]) != b.unique_key:
                problems.append(
                    DagProblem(
                        at,
                        f"the columns and unique_key of buffered dataset '{b.name}' cannot "
                        "change (its stored rows keep them): declare a new dataset",
                    )
                )
            else:
                BufferStore(conn).update_buffered(
                    dataset_uuid=row["dataset_uuid"],
                    writers=b.writers,
                    max_rows=b.max_rows,
                    max_bytes=b.max_bytes,
                )
            continue
        if RegistryStore(conn).dataset_by_name(org_id=org_id, name=b.name).fetchone():
            problems.append(DagProblem(f"{at}.name", f"dataset name '{b.name}' is taken"))
            continue
        if actor is not None:
            names.check_publish(conn, actor, dag_id, b.name, False)
        create(
            conn,
            org_id=org_id,
            dag_id=dag_id,
            version=version,
            name=b.name,
            columns=columns,
            unique_key=b.unique_key,
            writers=b.writers,
            max_rows=b.max_rows,
            max_bytes=b.max_bytes,
        )
    return problems


def create(
    conn: Connection[Any],
    *,
    org_id: UUID,
    dag_id: UUID,
    version: int,
    name: str,
    columns: list[dict[str, Any]],
    unique_key: list[str],
    writers: list[str],
    max_rows: int,
    max_bytes: int,
) -> UUID:
    """A new buffered dataset: its dataset row, its one version (current for good), its
    declaration and its own queue. Returns its dataset_uuid."""
    ds, ver = uuid.uuid4(), uuid.uuid4()
    table = version_location(org_id, ds, ver, "postgres")
    store = BufferStore(conn)
    store.insert_dataset(
        dataset_uuid=ds,
        org_id=org_id,
        name=name,
        location=dataset_location(org_id, ds, "postgres"),
        unique_key=unique_key,
        dag_id=dag_id,
    )
    store.insert_version(
        dataset_version=ver,
        dataset_uuid=ds,
        dag_id=dag_id,
        dag_version=version,
        table_name=table,
        unique_key=unique_key,
    )
    store.insert_buffered(
        dataset_uuid=ds,
        org_id=org_id,
        name=name,
        dag_id=dag_id,
        columns=Jsonb(columns),
        unique_key=unique_key,
        writers=writers,
        max_rows=max_rows,
        max_bytes=max_bytes,
        table_name=table,
        queue_name=buffer_queue(ds),
    )
    return ds


def check_writers(conn: Connection[Any], spec: DagSpec, org_id: UUID) -> list[DagProblem]:
    """Every buffer output of the DAG's jobs names a buffered dataset the job may write (the
    alert datasets' writers set first); another job's publish is refused (403)."""
    problems: list[DagProblem] = []
    for job_name, job in spec.jobs.items():
        for i, name in enumerate(job.buffer_outputs):
            row = BufferStore(conn).buffered_by_name(org_id=org_id, name=name).fetchone()
            if row is None:
                problems.append(
                    DagProblem(
                        f"jobs.{job_name}.buffer_outputs[{i}]",
                        f"unknown buffered dataset '{name}'",
                    )
                )
            elif f"{spec.name}.{job_name}" not in row["writers"]:
                raise Forbidden(
                    f"job '{spec.name}.{job_name}' may not publish to buffered dataset "
                    f"'{name}': it is not one of its writers"
                )
    return problems
