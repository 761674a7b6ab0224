from __future__ import annotations

from pathlib import Path

from trace_platform.lite.demo import DEMO_DAG

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dags" / "monad_demo.yaml"


def test_the_shipped_demo_dag_is_the_example() -> None:
    """`trace demo` deploys the package's copy; users read examples/: one file, no drift."""
    assert DEMO_DAG.read_bytes() == EXAMPLE.read_bytes()
