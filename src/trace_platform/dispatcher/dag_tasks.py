"""From triggers and events to the tasks of DAG jobs (always inside the caller's transaction).

1 event -> 1 task per subscribed job of an active DAG version; every task records its parent
(the producer of its input event) and its run, so a run is a tree.
"""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.types.json import Jsonb

from trace_platform.contract import DatasetRef, EventIn, TaskSpec
from trace_platform.dag.schema import JobSpec
from trace_platform.dag.whole import task_pool
from trace_platform.store.dag_tasks import DagTaskStore


def _refs(rows: list[dict[str, Any]]) -> list[DatasetRef]:
    return [
        DatasetRef(
            dataset_uuid=r["dataset_uuid"],
            dataset_version=r["dataset_version"],
            dataset_name=r["dataset_name"],
            backend=r["backend"],
            location=r["location"],
            output_index=r.get("output_index"),
        )
        for r in rows
    ]


def job_task(
    conn: Connection[Any],
    *,
    org_id: UUID,
    dag_id: UUID,
    version: int,
    job_name: str,
    job: JobSpec,
    run_id: UUID,
    parent_task_id: UUID | None = None,
    input_event_id: UUID | None = None,
    input_event: dict[str, Any] | None = None,
) -> TaskSpec:
    key = {"dag_id": dag_id, "version": version, "job": job_name}
    # A whole-scope writer without a pool of its own gets its implicit one-slot pool.
    pool, max_concurrency = task_pool(job_name, job)
    return TaskSpec(
        job=job_name,
        operator=job.operator,
        runtime=job.runtime,
        config=job.config,
        org_id=org_id,
        dag_id=dag_id,
        dag_version=version,
        parent_task_id=parent_task_id,
        input_event_id=input_event_id,
        input_event=input_event,
        input_versions=_refs(DagTaskStore(conn).job_inputs(**key).fetchall()),
        outputs=_refs(DagTaskStore(conn).job_outputs(**key).fetchall()),
        run_id=run_id,
        worker_pool=pool,
        max_concurrency=max_concurrency,
        timeout_seconds=job.timeout_seconds,
        max_attempts=job.max_attempts,
    )


def _jobs(conn: Connection[Any], dag_id: UUID, version: int) -> dict[str, JobSpec]:
    row = DagTaskStore(conn).version_spec(dag_id=dag_id, version=version).fetchone()
    assert row is not None, f"dag {dag_id} has no version {version}"
    return {name: JobSpec.model_validate(j) for name, j in row["spec"]["jobs"].items()}


def tasks_for_event(
    conn: Connection[Any],
    *,
    org_id: UUID,
    producer: dict[str, Any],
    event_id: UUID,
    event: EventIn,
    invalidates: bool = False,
) -> list[tuple[TaskSpec, str]]:
    """One task for every job of a live DAG version that reads the event's dataset at the
    version the producer wrote (see `subscribers`), with the status it starts in: 'queued', or
    'buffered' for a rebuild's work held until cutover. An invalidation (the producer rewrote
    the scope, or says so in the payload, as an aggregator re-emitting a window does) reaches
    its readers marked `invalidates`."""
    DagTaskStore(conn).lock_dags_shared(dataset_uuid=event.dataset_uuid)
    written = next(
        (
            o.get("dataset_version")
            for o in producer.get("outputs") or []
            if str(o.get("dataset_uuid")) == str(event.dataset_uuid)
        ),
        None,
    )
    subs = (
        DagTaskStore(conn)
        .subscribers(
            dataset_uuid=event.dataset_uuid,
            org_id=org_id,
            written=written,
            producer_dag=producer.get("dag_id"),
            producer_version=producer.get("dag_version"),
        )
        .fetchall()
    )
    specs: list[tuple[TaskSpec, str]] = []
    cache: dict[tuple[UUID, int], dict[str, JobSpec]] = {}
    input_event = event_json(event_id, producer["task_id"], event)
    # Invalidations cascade: a task redoing an invalidated scope invalidates what it emits, so
    # every reader downstream recomputes without knowing the first cause.
    if invalidates or producer.get("reprocessing") or event.payload.get("invalidates") is True:
        input_event["invalidates"] = True
    for s in subs:
        key = (s["dag_id"], s["dag_version"])
        if key not in cache:  # one spec read per DAG version, however many of its jobs read
            cache[key] = _jobs(conn, *key)
        jobs = cache[key]
        spec = job_task(
            conn,
            org_id=org_id,
            dag_id=s["dag_id"],
            version=s["dag_version"],
            job_name=s["job"],
            job=jobs[s["job"]],
            # A shared read starts the consumer DAG's own run; within a DAG the run flows on.
            run_id=producer["run_id"]
            if producer["dag_id"] == s["dag_id"] and producer["run_id"]
            else event_id,
            parent_task_id=producer["task_id"],
            input_event_id=event_id,
            input_event=input_event,
        )
        specs.append((spec, s["status"]))
    return specs


def event_json(event_id: UUID, producer_task_id: UUID, event: EventIn) -> dict[str, Any]:
    """An event as the task it starts sees it."""
    return {
        "event_id": str(event_id),
        "producer_task_id": str(producer_task_id),
        **event.model_dump(mode="json", exclude_none=True),
    }


def fire(
    conn: Connection[Any],
    *,
    dag: dict[str, Any],
    trigger: str,
    kind: str,
    fire_key: str,
    config: dict[str, Any],
    fired_by: UUID | None,
) -> tuple[UUID, list[tuple[TaskSpec, str]]]:
    """Records the firing (once per (dag, trigger, fire_key)) and returns the source-job tasks
    to create with their status (a rebuilding version's are held until cutover); an
    already-recorded firing returns its run and no tasks."""
    DagTaskStore(conn).lock_dag_shared(dag_id=dag["dag_id"])
    run_id = uuid.uuid4()
    row = (
        DagTaskStore(conn)
        .insert_fire(
            run_id=run_id,
            dag_id=dag["dag_id"],
            dag_version=dag["active_version"],
            trigger=trigger,
            kind=kind,
            fire_key=fire_key,
            config=Jsonb(config),
            fired_by=fired_by,
        )
        .fetchone()
    )
    if row is None:
        existing = (
            DagTaskStore(conn)
            .fire_by_key(dag_id=dag["dag_id"], trigger=trigger, fire_key=fire_key)
            .fetchone()
        )
        assert existing is not None
        return existing["run_id"], []
    event = fire_event(trigger, kind, fire_key, config)
    specs: list[tuple[TaskSpec, str]] = []
    cache: dict[int, dict[str, JobSpec]] = {}
    for s in DagTaskStore(conn).source_jobs(dag_id=dag["dag_id"]).fetchall():
        if s["version"] not in cache:
            cache[s["version"]] = _jobs(conn, dag["dag_id"], s["version"])
        spec = job_task(
            conn,
            org_id=dag["org_id"],
            dag_id=dag["dag_id"],
            version=s["version"],
            job_name=s["job"],
            job=cache[s["version"]][s["job"]],
            run_id=run_id,
            input_event=event,
        )
        specs.append((spec, s["status"]))
    return run_id, specs


def fire_event(trigger: str, kind: str, fire_key: str, config: dict[str, Any]) -> dict[str, Any]:
    """A trigger firing as the source job it starts sees it."""
    return {"trigger": trigger, "kind": kind, "fire_key": fire_key, "config": config}
