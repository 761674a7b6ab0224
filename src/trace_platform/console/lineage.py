"""A dataset's lineage, from the specs of the DAGs the user may see (the control plane's
`show_dag`: what the API shows them) and only through datasets they may read."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any
from uuid import UUID

from trace_platform.console.svg import Edge, dag_graph
from trace_platform.control.service import ControlPlane
from trace_platform.identity import Actor


class SpecCache:
    """DAG specs read so far, by (DAG id, version). A deployed version's spec never changes,
    so the lineage reads each one once per process instead of every visible DAG's spec on
    every view (one read per DAG, the control plane having no call that lists specs). Who may
    see a spec is still decided at each view, by the DAG list's `can_deploy` (show_dag's own
    rule). The oldest are dropped past `size`; locked, as pages render on pool threads."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self.specs: OrderedDict[tuple[UUID, int], dict[str, Any]] = OrderedDict()
        self.lock = threading.Lock()

    def visible(self, cp: ControlPlane, user: Actor) -> dict[str, dict[str, Any]]:
        """The active spec of each DAG the user may see the spec of."""
        out = {}
        for d in cp.list_dags(user):
            if not d["can_deploy"] or d["active_version"] is None:
                continue
            key = (d["dag_id"], d["active_version"])
            with self.lock:
                spec = self.specs.get(key)
                if spec is not None:
                    self.specs.move_to_end(key)
            if spec is None:
                shown = cp.show_dag(user, d["name"])  # its active version now: a cutover since
                spec = shown["spec"]  # the list is as good
                self._keep((shown["dag_id"], shown["version"]), spec)
            out[d["name"]] = spec
        return out

    def _keep(self, key: tuple[UUID, int], spec: dict[str, Any]) -> None:
        with self.lock:
            self.specs[key] = spec
            while len(self.specs) > self.size:
                self.specs.popitem(last=False)


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
