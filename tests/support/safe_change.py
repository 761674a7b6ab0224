"""The safe-change pipeline (`chg`: source -> decode -> agg, and `side`) driven by hand through
the Dispatcher on a real Postgres: each task writes its input's ranges to its outputs, so every
assertion on what landed is exact (tests/integration/test_safe_change*.py, test_backfill,
test_review_attacks)."""

from __future__ import annotations

import uuid
from typing import Any

from tests.support.dags import admin
from trace_platform.contract import (
    ClaimRequest,
    CompleteRequest,
    EventIn,
    LeaseRef,
    OutputCommit,
    RangeSpec,
)
from trace_platform.errors import Conflict
from trace_platform.layout import scope_prefix
from trace_platform.services import Services

PIPELINE = """
name: chg
jobs:
  source:
    operator: noop
    outputs: [{{backend: parquet}}]
  decode:
    operator: noop
    config: {{mode: {mode}}}
    inputs: [{{job: source, output: 0}}]
    outputs: [{{backend: parquet}}]
  agg:
    operator: noop
    inputs: [{{job: decode, output: 0}}]
    outputs: [{{backend: parquet}}]
  side:
    operator: noop
    inputs: [{{job: source, output: 0}}]
    outputs: [{{backend: parquet}}]
publish:
  - {{job: decode, output_index: 0, dataset: chg_decoded}}
  - {{job: agg, output_index: 0, dataset: chg_agg}}
  - {{job: side, output_index: 0, dataset: chg_side}}
"""


def pipeline(mode: str = "a", timeout: int | None = None) -> str:
    text = PIPELINE.format(mode=mode)
    if timeout is not None:
        text = text.replace("  agg:\n", f"  agg:\n    timeout_seconds: {timeout}\n")
    return text


def q(services: Services, sql: str, *args: Any) -> list[dict[str, Any]]:
    with services.pool.connection() as conn:
        return conn.execute(sql, args).fetchall()


def current(services: Services) -> dict[str, uuid.UUID]:
    rows = q(
        services,
        "SELECT ds.dataset_name, c.dataset_version FROM dataset_current c "
        "JOIN datasets ds USING (dataset_uuid) WHERE ds.dataset_name IS NOT NULL",
    )
    return {r["dataset_name"]: r["dataset_version"] for r in rows}


def fire(services: Services, *ranges: tuple[int, int]) -> None:
    services.control.trigger(admin(services), "chg", config={"ranges": [list(r) for r in ranges]})


def claimable(services: Services) -> list[uuid.UUID]:
    rows = q(
        services,
        "SELECT s.task_id FROM task_status s JOIN task_registry r USING (task_id, start_day) "
        "WHERE s.status = 'queued' AND NOT s.cancel_requested ORDER BY r.created_at, r.job",
    )
    return [r["task_id"] for r in rows]


def start(services: Services, task_id: uuid.UUID) -> tuple[LeaseRef, Any]:
    d = services.dispatcher
    c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
    ref = LeaseRef(task_id=task_id, attempt=c.attempt, lease_token=c.lease_token)
    return ref, d.fetch(ref)


def finish(services: Services, ref: LeaseRef, payload: Any) -> str:
    """Completes a started task: each output gets the input's ranges (commit + event)."""
    ev = payload.input_event or {}
    if "range" in ev:
        ranges = [(ev["range"]["start"], ev["range"]["end"])]
    else:
        ranges = [tuple(r) for r in (ev.get("config") or {}).get("ranges", [])]
    events, commits = [], []
    for o in payload.outputs:
        for a, b in ranges:
            events.append(EventIn(dataset_uuid=o.dataset_uuid, range=RangeSpec(start=a, end=b)))
            commits.append(
                OutputCommit(
                    dataset_uuid=o.dataset_uuid,
                    range=RangeSpec(start=a, end=b),
                    location=scope_prefix(
                        str(o.location), ref.task_id, ref.attempt, rng=RangeSpec(start=a, end=b)
                    ),
                    row_count=b - a + 1,
                )
            )
    res = services.dispatcher.complete(
        CompleteRequest(
            **ref.model_dump(), outcome="succeeded", final_events=events, outputs=commits
        )
    )
    return res.status


def run_all(services: Services) -> list[tuple[str, int, str]]:
    """Runs every claimable task (and what they start) to the end: (job, dag_version, scope)."""
    ran: list[tuple[str, int, str]] = []
    while ids := claimable(services):
        progressed = False
        for task_id in ids:
            try:
                ref, payload = start(services, task_id)
            except Conflict:
                continue
            finish(services, ref, payload)
            ev = payload.input_event or {}
            scope = f"{ev['range']['start']}-{ev['range']['end']}" if "range" in ev else "fire"
            ran.append((payload.job, payload.dag_version, scope))
            progressed = True
        if not progressed:
            break
    return ran


def commits(services: Services, dataset: str) -> list[tuple[str, int | None]]:
    """(scope, dag_version) of every commit of the dataset's current version."""
    rows = q(
        services,
        "SELECT dc.scope, dc.dag_version FROM dataset_commits dc "
        "JOIN dataset_current c ON c.dataset_version = dc.dataset_version "
        "JOIN datasets ds ON ds.dataset_uuid = c.dataset_uuid WHERE ds.dataset_name = %s "
        "ORDER BY dc.scope",
        dataset,
    )
    return [(r["scope"], r["dag_version"]) for r in rows]


def statuses(services: Services, job: str, version: int) -> list[str]:
    rows = q(
        services,
        "SELECT s.status FROM task_status s JOIN task_registry r USING (task_id, start_day) "
        "WHERE r.job = %s AND r.dag_version = %s ORDER BY s.status",
        job,
        version,
    )
    return [r["status"] for r in rows]


def deployed_live(services: Services) -> Services:
    """Version 1 deployed, and two ranges through the whole pipeline (the modules' `live`)."""
    services.control.deploy(admin(services), pipeline("a"))
    fire(services, (0, 99), (100, 199))
    run_all(services)
    assert commits(services, "chg_agg") == [("range:0-99", 1), ("range:100-199", 1)]
    return services


def cut_over_v2(services: Services) -> None:
    """Version 2 (decode's config changed) deployed, rebuilt and made live."""
    services.control.deploy(admin(services), pipeline("b"))
    run_all(services)
    (done,) = services.control.changes.auto_cutover()
    assert done["version"] == 2
