"""A dataset's lineage, from the specs of the DAGs the user may see (the control plane's
`show_dag`: what the API shows them) and only through datasets they may read."""

from __future__ import annotations

from typing import Any

from trace_platform.console.svg import Edge, dag_graph
from trace_platform.control.service import ControlPlane
from trace_platform.identity import Actor


def visible_specs(cp: ControlPlane, user: Actor) -> dict[str, dict[str, Any]]:
    """The active spec of each DAG the user may see the spec of."""
    return {
        d["name"]: cp.show_dag(user, d["name"])["spec"]
        for d in cp.list_dags(user)
        if d["can_deploy"] and d["active_version"] is not None
    }


def _union(specs: dict[str, dict[str, Any]]) -> list[Edge]:
    """Every DAG's edges in one graph: jobs named by their DAG, datasets by their own name."""
    edges: list[Edge] = []
    for dag, spec in specs.items():
        for a, b in dag_graph(spec)[1]:
            edges.append(tuple(n if n.startswith("dataset:") else f"{dag}/{n}" for n in (a, b)))  # type: ignore[arg-type]
    return edges


def _reach(start: str, edges: list[Edge]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        n = todo.pop()
        for a, b in edges:
            if a == n and b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def lineage(
    specs: dict[str, dict[str, Any]], dataset: str, readable: set[str]
) -> dict[str, list[str]]:
    """The readable datasets upstream and downstream of `dataset`."""
    edges = _union(specs)
    node = f"dataset:{dataset}"

    def names(nodes: set[str]) -> list[str]:
        return sorted(
            n.removeprefix("dataset:")
            for n in nodes
            if n.startswith("dataset:") and n != node and n.removeprefix("dataset:") in readable
        )

    return {
        "upstream": names(_reach(node, [(b, a) for a, b in edges])),
        "downstream": names(_reach(node, edges)),
    }
