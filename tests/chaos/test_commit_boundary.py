"""The commit boundary on the real stack (issue 38): hostile operator code, in a real sandboxed
host on a real worker, sends every forged commit shape the review found. Each completion is
refused (the attempt fails naming the rule), nothing lands, and the victim's data and commit
are untouched."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from tests.support.dags import admin
from tests.support.datasets import commit_parquet, current, version_location
from tests.support.wait import wait_for
from trace_platform import layout
from trace_platform.config import Settings
from trace_platform.contract import DatasetRef, TaskSpec
from trace_platform.lite.stack import LiteStack

pytestmark = pytest.mark.slow

DAG = """
name: {name}
jobs:
  make:
    operator: noop
    outputs: [{{backend: parquet}}]
publish:
  - {{job: make, output_index: 0, dataset: {name}_rows}}
"""


@pytest.fixture
def stack(settings: Settings, dsn: str) -> Iterator[LiteStack]:
    # A lease long enough for a host's start on a busy machine: the refusal, not a lost lease,
    # is what fails these attempts.
    roomy = settings.model_copy(update={"lease_seconds": 30.0, "heartbeat_seconds": 1.0})
    s = LiteStack(roomy, workers=1, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"})
    s.start()
    yield s
    s.stop()


def _commits(stack: LiteStack, version: Any) -> list[dict[str, Any]]:
    with stack.services.pool.connection() as conn:
        return conn.execute(
            "SELECT task_id, scope, location FROM dataset_commits WHERE dataset_version = %s",
            [version],
        ).fetchall()


def test_forged_commits_from_a_hostile_host_are_refused_and_land_nothing(
    stack: LiteStack,
) -> None:
    svc = stack.services
    for name in ("victim", "attacker"):
        svc.control.deploy(admin(svc), DAG.format(name=name))
    victim = current(svc, "victim_rows")
    commit_parquet(svc, "victim_rows", pa.table({"secret": [1, 2, 3]}), 0, 10)
    before = _commits(stack, victim["current_version"])
    mine = current(svc, "attacker_rows")
    own_version = mine["current_version"]
    own_location = version_location(svc, own_version)
    with svc.pool.connection() as conn:
        org = conn.execute("SELECT org_id FROM orgs LIMIT 1").fetchone()["org_id"]
    own = DatasetRef(
        dataset_uuid=mine["dataset_uuid"],
        dataset_version=own_version,
        backend="parquet",
        location=own_location,
    )
    table = layout.version_location(org, mine["dataset_uuid"], own_version, "postgres")
    own_table = own.model_copy(update={"backend": "postgres", "location": table})
    rng = {"start": 0, "end": 10}
    # Each forged shape: (the output it was assigned, the commit it sends, the rule named).
    forged: dict[str, tuple[DatasetRef, dict[str, Any], str]] = {
        "the victim's version": (
            own,
            {"dataset_version": str(victim["current_version"])},
            "writes only its assigned version",
        ),
        "the org's prefix": (own, {"location": f"org/{org}/dataset/"}, "own prefix"),
        "the victim's prefix": (
            own,
            {"location": version_location(svc, victim["current_version"])},
            "own prefix",
        ),
        "a prefix above its own": (own, {"location": own_location}, "own prefix"),
        "a table outside dataset schemas": (
            own_table,
            {"location": "public.api_keys"},
            "the version's own table",
        ),
    }
    tasks = {}
    for what, (out, fields, _) in forged.items():
        commit = {"dataset_uuid": str(out.dataset_uuid), "range": rng, **fields}
        end = {"type": "done", "final_events": [], "outputs": [commit]}
        tasks[what] = svc.dispatcher.create_task(
            TaskSpec(
                job="forge",
                operator="probe",
                config={"send": [end], "then_exit": True},
                outputs=[out],
                max_attempts=1,
            )
        ).task_id
    for what, task_id in tasks.items():
        view = wait_for(
            lambda t=task_id: (
                (v := svc.dispatcher.get_task(t)).status in ("failed", "succeeded") and v
            ),
            60,
            f"the forged commit of {what}",
        )
        rule = forged[what][2]
        assert view.status == "failed", (what, view.last_error)
        assert "completion refused" in (view.last_error or ""), (what, view.last_error)
        assert rule in (view.last_error or ""), (what, view.last_error)
        assert view.attempt == 1 and view.events == 0
    assert _commits(stack, own_version) == []
    assert _commits(stack, victim["current_version"]) == before
    with svc.pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM retired_locations").fetchone()["n"] == 0
        assert conn.execute("SELECT to_regclass('public.api_keys') IS NOT NULL").fetchone()[
            "?column?"
        ]
    rows = svc.query.query(admin(svc), "SELECT * FROM victim_rows").as_json()["rows"]
    assert sorted(r[0] for r in rows) == [1, 2, 3]
    assert uuid.UUID(str(victim["dataset_uuid"])) != own.dataset_uuid
