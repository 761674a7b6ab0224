"""Holes a fresh security review of issues 38 and 44 found, each a regression test that failed
before its fix: a dataset's producer reaching its readers' runs through `runs show/cancel`,
and the platform DAG's name free for anyone to squat. Tasks are driven by hand through the
Dispatcher (the helpers of test_safe_change); hostile users come from tests/support/dags.user()."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.dags import admin, user
from tests.support.safe_change import claimable, finish, q, start
from trace_platform.errors import Forbidden
from trace_platform.services import Services

PRODUCER = """
name: mal_up
jobs:
  src:
    operator: noop
    outputs: [{backend: parquet}]
publish:
  - {job: src, output_index: 0, dataset: mal_rows}
"""

CONSUMER = """
name: victim_dag
jobs:
  count:
    operator: noop
    inputs: [{from: {dataset: mal_rows}}]
    outputs: [{backend: parquet}]
"""


def _status(services: Services, task_id: Any) -> dict[str, Any]:
    (row,) = q(
        services,
        "SELECT s.status, s.cancel_requested, r.dag_id FROM task_status s "
        "JOIN task_registry r USING (task_id, start_day) WHERE s.task_id = %s",
        task_id,
    )
    return row


def test_a_producer_cannot_see_or_cancel_its_readers_runs(
    services: Services,
) -> None:
    """`run_tree` followed parent_task_id across DAGs, and a shared read's consumer task has
    the producer's task as its parent (its run_id is its own DAG's run): the owner of a
    published dataset canceled, and read the task tree of, every DAG of other users reading
    it. A run now stays within its own DAG; the reader's tasks are a run of their own."""
    mallory, _ = user(services, "mallory")  # a no-role user owning a producer DAG
    me = admin(services)  # the victim: any user whose DAG reads mallory's dataset
    services.control.deploy(mallory, PRODUCER)
    services.control.deploy(me, CONSUMER)
    run = services.control.trigger(mallory, "mal_up", config={"ranges": [[0, 10], [10, 20]]})
    (src,) = claimable(services)
    ref, payload = start(services, src)
    assert finish(services, ref, payload) == "succeeded"
    victims = [t for t in claimable(services) if t != src]
    assert victims, "the consumer DAG got no task"
    victim_dag = _status(services, victims[0])["dag_id"]

    shown = services.control.show_run(mallory, run["run_id"])
    leaked = [t for t in shown["tasks"] if t["dag_id"] == victim_dag]
    res = services.control.cancel_run(mallory, run["run_id"])
    after = [_status(services, t) for t in victims]
    # Mallory may see and cancel only her own DAG's tasks.
    assert all(not a["cancel_requested"] and a["status"] == "queued" for a in after), (
        f"mallory's runs cancel ({res}) canceled the victim's tasks: {after}"
    )
    assert leaked == [], f"runs show lists {len(leaked)} task(s) of another user's DAG"


PLATFORM = (
    "name: monad_demo\njobs:\n  p: {operator: noop, outputs: [{backend: parquet}]}\n"
    "publish:\n  - {job: p, output_index: 0, dataset: blocks}\n"
)
SQUAT = "name: monad_demo\njobs:\n  p: {operator: noop, outputs: [{backend: parquet}]}\n"


def _published(services: Services, name: str) -> Any:
    rows = q(
        services,
        "SELECT ds.dataset_uuid, d.name AS dag, d.owner_user_id FROM datasets ds "
        "JOIN dags d ON d.dag_id = ds.producer_dag_id WHERE ds.dataset_name = %s",
        name,
    )
    return rows[0] if rows else None


def test_the_platform_dag_name_cannot_be_squatted(services: Services) -> None:
    """The platform DAG's own name (`registry/reserved.PLATFORM_DAG`, which saved queries and
    `trace verify` pin) was free for anyone: a no-role user deployed `monad_demo` first, the
    admin's demo deploy landed in it, the squatter stayed its owner, and her next version
    unpublished the reserved names. Now only an admin deploys it, and an admin's deploy takes a
    squatted one (made before the rule) back: the squatter can no longer deploy or run it."""
    mallory, _ = user(services, "mallory")
    me = admin(services)
    with pytest.raises(Forbidden, match="may not deploy DAG 'monad_demo': it is the platform's"):
        services.control.deploy(mallory, SQUAT)
    assert q(services, "SELECT count(*) AS n FROM dags")[0]["n"] == 0  # nothing stored
    # A squat made before the rule (or by any other path): the admin's deploy takes it over.
    with services.pool.connection() as conn:
        conn.execute(
            "INSERT INTO dags (dag_id, org_id, name, owner_user_id)"
            " VALUES (gen_random_uuid(), %s, 'monad_demo', %s)",
            [mallory.org_id, mallory.user_id],
        )
    services.control.deploy(me, PLATFORM)
    published = _published(services, "blocks")
    assert published["dag"] == "monad_demo" and published["owner_user_id"] == me.user_id
    with pytest.raises(Forbidden):
        services.control.deploy(mallory, SQUAT)
    with pytest.raises(Forbidden):
        services.control.trigger(mallory, "monad_demo")
    assert _published(services, "blocks") is not None
