"""Every rejected DAG file gets its specific message, naming file, job and field."""

from __future__ import annotations

import pytest

from tests.support.dags import admin, three_jobs
from trace_platform.dag.validate import DagInvalid, parse
from trace_platform.services import Services

OK_JOB = "operator: noop"

BAD: list[tuple[str, str, str]] = [
    ("yaml syntax", "name: x\njobs: [unclosed", "line 2"),
    ("not a mapping", "- just\n- a list", "must be a YAML mapping"),
    ("missing jobs", "name: x", "jobs: required field is missing"),
    (
        "bad dag name",
        f"name: Bad-Name\njobs:\n  a: {{{OK_JOB}}}",
        "name: String should match pattern",
    ),
    ("unknown top field", f"name: x\nowner: me\njobs:\n  a: {{{OK_JOB}}}", "owner: unknown field"),
    (
        "duplicate job key",
        f"name: x\njobs:\n  a: {{{OK_JOB}}}\n  a: {{{OK_JOB}}}",
        "duplicate key 'a'",
    ),
    (
        "missing operator",
        "name: x\njobs:\n  a: {runtime: ecs_platform}",
        "jobs.a.operator: required field is missing",
    ),
    (
        "unknown operator",
        "name: x\njobs:\n  a: {operator: teleport}",
        "jobs.a.operator: unknown operator 'teleport'",
    ),
    (
        "bad runtime",
        "name: x\njobs:\n  a: {operator: noop, runtime: docker}",
        "jobs.a.runtime: String should match pattern",
    ),
    (
        "bulk strategy",
        "name: x\njobs:\n  a: {operator: noop, execution_strategy: Bulk}",
        "range_aggregator / range_splitter",
    ),
    (
        "scaling.mode",
        "name: x\njobs:\n  a: {operator: noop, scaling: {mode: auto}}",
        "jobs.a.scaling: scaling.mode is not supported",
    ),
    (
        "live/backfill mode",
        "name: x\njobs:\n  a: {operator: noop, mode: live}",
        "mode: live|backfill is not supported",
    ),
    (
        "dangling input",
        "name: x\njobs:\n  a: {operator: noop, inputs: [{job: ghost}]}",
        "jobs.a.inputs[0].job: references job 'ghost' which does not exist",
    ),
    (
        "output index",
        "name: x\njobs:\n  a: {operator: noop}\n  b: {operator: noop, inputs: [{job: a, output: 2}]}",
        "jobs.b.inputs[0].output: job 'a' has 0 output(s); index 2 does not exist",
    ),
    (
        "cycle",
        "name: x\njobs:\n  a: {operator: noop, inputs: [{job: b}], outputs: [{}]}\n  b: {operator: noop, inputs: [{job: a}], outputs: [{}]}",
        "the jobs form a cycle",
    ),
    (
        "bad job name",
        "name: x\njobs:\n  Bad: {operator: noop}",
        "jobs.Bad: job name 'Bad' must match",
    ),
    (
        "bad dataset name",
        "name: x\njobs:\n  a: {operator: noop, outputs: [{}]}\npublish: [{job: a, output_index: 0, dataset: Raw-Data}]",
        "publish[0].dataset: dataset name 'Raw-Data' must match",
    ),
    (
        "duplicate dataset",
        "name: x\njobs:\n  a: {operator: noop, outputs: [{}, {}]}\npublish:\n  - {job: a, output_index: 0, dataset: d}\n  - {job: a, output_index: 1, dataset: d}",
        "publish[1].dataset: dataset 'd' is already published by publish[0]",
    ),
    (
        "publish unknown job",
        "name: x\njobs:\n  a: {operator: noop}\npublish: [{job: b, dataset: d}]",
        "publish[0].job: publishes job 'b' which does not exist",
    ),
    (
        "append without key",
        "name: x\njobs:\n  a: {operator: noop, outputs: [{update_strategy: append}]}",
        "append needs unique_key",
    ),
    (
        "unknown pool",
        "name: x\njobs:\n  a: {operator: noop, worker_pool: gpu}",
        "jobs.a.worker_pool: worker pool 'gpu' is not defined",
    ),
    (
        "bad cron",
        "name: x\njobs:\n  a: {operator: noop}\ntriggers: {cron: [{name: c, schedule: 'every day'}]}",
        "'every day' is not a valid cron expression",
    ),
    (
        "negative timeout",
        "name: x\njobs:\n  a: {operator: noop, timeout_seconds: -5}",
        "jobs.a.timeout_seconds: Input should be greater than 0",
    ),
    (
        "empty pool",
        "name: x\nworker_pools: {rpc: []}\njobs:\n  a: {operator: noop, worker_pool: rpc}",
        "worker_pools.rpc: a worker pool needs at least one slot",
    ),
]


@pytest.mark.parametrize(("case", "text", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_dag_file_gets_its_specific_message(case: str, text: str, message: str) -> None:
    with pytest.raises(DagInvalid) as e:
        parse(text, "bad.yaml")
    rendered = str(e.value)
    assert message in rendered, rendered
    assert rendered.startswith("bad.yaml: ")


def test_all_problems_reported_at_once() -> None:
    text = "name: x\njobs:\n  a: {operator: teleport, inputs: [{job: ghost}], worker_pool: nope}"
    with pytest.raises(DagInvalid) as e:
        parse(text, "many.yaml")
    assert len(e.value.problems) == 3


def _state(services: Services) -> dict[str, int]:
    with services.pool.connection() as conn:
        return {
            t: conn.execute(f"SELECT count(*) AS n FROM {t}").fetchone()["n"]  # type: ignore[index]
            for t in (
                "dags",
                "dag_versions",
                "datasets",
                "dataset_versions",
                "dag_subscriptions",
                "pool_slots",
            )
        }


def test_deploy_time_rejections_leave_nothing_half_deployed(services: Services) -> None:
    cp, me = services.control, admin(services)
    cp.deploy(me, three_jobs("first"))
    before = _state(services)
    # A second DAG publishing a dataset the first one owns.
    steal = three_jobs("second").replace("second_raw", "first_raw")
    with pytest.raises(DagInvalid, match="dataset 'first_raw' is produced by DAG 'first'"):
        cp.deploy(me, steal, "steal.yaml")
    # A shared read of a dataset that does not exist.
    ghost = "name: third\njobs:\n  a: {operator: noop, inputs: [{from: {dataset: nowhere}}]}"
    with pytest.raises(
        DagInvalid, match=r"jobs.a.inputs\[0\].from.dataset: unknown dataset 'nowhere'"
    ):
        cp.deploy(me, ghost, "ghost.yaml")
    # A pool slot naming a secret nobody set.
    secretive = (
        "name: fourth\nworker_pools: {rpc: [{secrets: {KEY: missing_key}}]}\n"
        "jobs:\n  a: {operator: noop, worker_pool: rpc}"
    )
    with pytest.raises(DagInvalid, match="secret 'missing_key' is not set"):
        cp.deploy(me, secretive, "secret.yaml")
    assert _state(services) == before
