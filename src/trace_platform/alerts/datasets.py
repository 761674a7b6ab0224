"""The org-wide alert datasets the platform declares: `alert_events` (every alert a rule
raised, "would have alerted" included) and `alert_deliveries` (the routed work items). Both are
buffered datasets of the org, registered at the deploy of the first DAG that runs the operator
feeding them; their writers are exactly the org's jobs that run that operator, kept by every
deploy, cutover and rollback of each DAG. Their columns are the platform's and never change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import Connection

from trace_platform.dag.schema import DagSpec
from trace_platform.dag.validate import DagProblem
from trace_platform.registry import buffered
from trace_platform.store.alerts import AlertStore
from trace_platform.store.buffers import BufferStore
from trace_platform.store.registry import RegistryStore

SEVERITIES = ("info", "warning", "critical")  # in rising order


def _col(name: str, type_: str, required: bool = True) -> dict[str, Any]:
    return {"name": name, "type": type_, "required": required}


@dataclass(frozen=True)
class PlatformDataset:
    name: str
    operator: str  # the jobs that run it are its writers
    columns: tuple[dict[str, Any], ...]
    unique_key: tuple[str, ...]
    max_rows: int = 100_000
    max_bytes: int = 64 * 1024 * 1024


ALERT_EVENTS = PlatformDataset(
    name="alert_events",
    operator="alert_evaluate",
    columns=(
        _col("dag_id", "text"),
        _col("job", "text"),
        _col("rule", "text"),
        _col("dedupe_key", "text"),
        _col("severity", "text"),
        _col("event_time", "timestamp"),
        _col("payload", "json"),
    ),
    unique_key=("dag_id", "job", "rule", "dedupe_key"),
)

ALERT_DELIVERIES = PlatformDataset(
    name="alert_deliveries",
    operator="alert_route",
    columns=(
        _col("idempotency_key", "text"),
        _col("destination", "text"),
        _col("status", "text"),  # pending (to send) | suppressed (older than max_delivery_age)
        _col("alert_dag_id", "text"),
        _col("alert_job", "text"),
        _col("rule", "text"),
        _col("dedupe_key", "text"),
        _col("severity", "text"),
        _col("event_time", "timestamp"),
        _col("payload", "json"),
        _col("reason", "text", required=False),
    ),
    unique_key=("idempotency_key",),
)

PLATFORM = (ALERT_EVENTS, ALERT_DELIVERIES)


def register(
    conn: Connection[Any], spec: DagSpec, *, org_id: UUID, dag_id: UUID, version: int
) -> list[DagProblem]:
    """In the deploy's (cutover's, rollback's) transaction: the org's alert datasets exist
    once a DAG runs their operator, and this DAG's writers of each are its jobs running it."""
    problems: list[DagProblem] = []
    for pd in PLATFORM:
        jobs = sorted(j for j, js in spec.jobs.items() if js.operator == pd.operator)
        row = BufferStore(conn).buffered_by_name(org_id=org_id, name=pd.name).fetchone()
        if row is None:
            if not jobs:
                continue
            if RegistryStore(conn).dataset_by_name(org_id=org_id, name=pd.name).fetchone():
                problems.append(
                    DagProblem(
                        f"jobs.{jobs[0]}.operator",
                        f"{pd.operator} writes the org's '{pd.name}', and that name is taken "
                        "by another dataset",
                    )
                )
                continue
            ds = _create(conn, pd, org_id=org_id, dag_id=dag_id, version=version)
        elif row.get("platform") != pd.name:
            if jobs:
                problems.append(
                    DagProblem(
                        f"jobs.{jobs[0]}.operator",
                        f"{pd.operator} writes the org's '{pd.name}', but a DAG declares a "
                        "buffered dataset of that name",
                    )
                )
            continue
        else:
            ds = row["dataset_uuid"]
        AlertStore(conn).set_dag_writers(
            dataset_uuid=ds, dag=spec.name, writers=[f"{spec.name}.{j}" for j in jobs]
        )
    return problems


def _create(
    conn: Connection[Any], pd: PlatformDataset, *, org_id: UUID, dag_id: UUID, version: int
) -> UUID:
    ds = buffered.create(
        conn,
        org_id=org_id,
        dag_id=dag_id,
        version=version,
        name=pd.name,
        columns=list(pd.columns),
        unique_key=list(pd.unique_key),
        writers=[],
        max_rows=pd.max_rows,
        max_bytes=pd.max_bytes,
    )
    AlertStore(conn).mark_platform(dataset_uuid=ds, platform=pd.name)
    return ds
