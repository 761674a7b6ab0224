"""A whole-scope writer (sql_transform) runs one at a time (trace_platform.dag.whole): without a
pool on an implicit one-slot pool of its own, never above max_concurrency 1."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.dags import whole_dag
from trace_platform.dag.validate import DagInvalid, parse
from trace_platform.dag.whole import implicit_pools, is_implicit_pool, task_pool
from trace_platform.db import migrate
from trace_platform.operators import WHOLE_OUTPUT_OPERATORS


def dag(job: str) -> str:
    return whole_dag("worker_pools:\n  analytics: [{}, {}]", job)


def test_a_whole_writer_without_a_pool_gets_an_implicit_one_slot_pool() -> None:
    spec = parse(dag(""))
    assert task_pool("supply", spec.jobs["supply"]) == ("whole:supply", 1)
    assert task_pool("src", spec.jobs["src"]) == (None, None)  # range writers: unchanged
    assert implicit_pools(spec) == ["whole:supply"]
    assert is_implicit_pool("whole:supply") and not is_implicit_pool("analytics")


def test_a_pooled_whole_writer_keeps_its_pool() -> None:
    spec = parse(dag("worker_pool: analytics"))
    assert task_pool("supply", spec.jobs["supply"]) == ("analytics", 1)
    assert implicit_pools(spec) == []


@pytest.mark.parametrize(
    "extra",
    [
        "scaling: {max_concurrency: 2}",
        "worker_pool: analytics\n    scaling: {max_concurrency: 2}",
    ],
)
def test_a_whole_writer_above_max_concurrency_1_is_refused(extra: str) -> None:
    with pytest.raises(DagInvalid) as e:
        parse(dag(extra), "whole.yaml")
    (problem,) = e.value.problems
    assert problem.where == "jobs.supply.scaling.max_concurrency"
    assert "job 'supply' (sql_transform) rewrites its output whole" in problem.message
    assert "older read last" in problem.message


def test_every_whole_output_operator_is_one_a_migration_backfilled() -> None:
    """Migration 0023 backfilled `task_status.whole_job` and `pool_slots.leased_whole` for the
    whole-output operators of its day, by name. A new one needs a migration doing the same for
    its live tasks and held slots: else its runs queued before the upgrade are found only by
    the rewake, and a slot it holds does not keep its job's next run waiting."""
    folder = Path(migrate.__file__).parent / "migrations"
    named = {
        op
        for f in sorted(folder.glob("*.sql"))
        if "whole_job" in (text := f.read_text()) or "leased_whole" in text
        for op in re.findall(r"r\.operator = '(\w+)'", text)
    }
    assert named == set(WHOLE_OUTPUT_OPERATORS)
