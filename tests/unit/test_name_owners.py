"""The platform's reserved names are exactly what its DAG publishes, and cover everything its
saved queries and `trace verify` read (issue 38): a name they read that anyone could publish
would let a squatter's numbers in."""

from __future__ import annotations

import yaml

from trace_platform.lite.demo.dag import DAG_NAME, DEMO_DAG
from trace_platform.query import guard, saved
from trace_platform.registry.reserved import PLATFORM_DAG, RESERVED


def test_reserved_names_are_what_the_platform_dag_publishes() -> None:
    dag = yaml.safe_load(DEMO_DAG.read_text())
    assert PLATFORM_DAG == DAG_NAME == dag["name"]
    assert {p["dataset"] for p in dag["publish"]} == RESERVED


def test_saved_queries_read_only_reserved_names_of_the_platform_dag() -> None:
    for name in saved.names():
        q = saved.load(name)
        assert q.producer == PLATFORM_DAG, name
        assert guard.dataset_names(q.sql) <= RESERVED, name
    # What `trace verify` reads besides the saved queries (verify/checks.py).
    assert {"blocks", "validator_stake"} <= RESERVED
