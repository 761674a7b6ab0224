"""Pictures drawn on the server as SVG (no script, no inline style: classes the stylesheet
colours): a DAG's jobs and datasets, and a bar or line chart of two result columns."""

from __future__ import annotations

import math
from typing import Any

from markupsafe import Markup, escape

Edge = tuple[str, str]

NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 170, 34, 60, 18, 10


def dag_graph(spec: dict[str, Any]) -> tuple[list[str], list[Edge]]:
    """A DAG's nodes (`job:NAME`, `dataset:NAME`) and edges: a job to the datasets it
    publishes, a dataset to the jobs reading it (a published output read by index, or a shared
    read), and job to job for an unpublished output."""
    published = {
        (p["job"], p.get("output_index", 0)): p["dataset"] for p in spec.get("publish") or []
    }
    nodes: list[str] = []
    edges: list[Edge] = []

    def dataset(name: str) -> str:
        if f"dataset:{name}" not in nodes:
            nodes.append(f"dataset:{name}")
        return f"dataset:{name}"

    for name, job in (spec.get("jobs") or {}).items():
        nodes.append(f"job:{name}")
        for i in job.get("inputs") or []:
            if "from" in i:
                edges.append((dataset(i["from"]["dataset"]), f"job:{name}"))
            elif (ds := published.get((i["job"], i.get("output", 0)))) is not None:
                edges.append((dataset(ds), f"job:{name}"))
            else:
                edges.append((f"job:{i['job']}", f"job:{name}"))
    for (job, _), ds in published.items():
        edges.append((f"job:{job}", dataset(ds)))
    return nodes, edges


def _layers(nodes: list[str], edges: list[Edge]) -> dict[str, int]:
    """Each node's column: the longest path to it (a DAG's graph has no cycle)."""
    layer = dict.fromkeys(nodes, 0)
    for _ in nodes:  # at most len(nodes) relaxations settle a longest path
        changed = False
        for a, b in edges:
            if a in layer and b in layer and layer[b] < layer[a] + 1:
                layer[b] = layer[a] + 1
                changed = True
        if not changed:
            break
    return layer


def graph_svg(nodes: list[str], edges: list[Edge], title: str) -> Markup:
    layer = _layers(nodes, edges)
    rows: dict[int, int] = {}
    at: dict[str, tuple[int, int]] = {}
    for n in nodes:
        col = layer[n]
        row = rows.get(col, 0)
        rows[col] = row + 1
        at[n] = (PAD + col * (NODE_W + GAP_X), PAD + row * (NODE_H + GAP_Y))
    width = PAD * 2 + (max(layer.values(), default=0) + 1) * (NODE_W + GAP_X) - GAP_X
    height = PAD * 2 + max(rows.values(), default=1) * (NODE_H + GAP_Y) - GAP_Y
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}">',
        f"<title>{escape(title)}</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto"><path d="M0,0 L10,5 L0,10 z" class="arrowhead"/>'
        "</marker></defs>",
    ]
    for a, b in edges:
        if a not in at or b not in at:
            continue
        (x1, y1), (x2, y2) = at[a], at[b]
        out.append(
            f'<line class="edge" x1="{x1 + NODE_W}" y1="{y1 + NODE_H // 2}" x2="{x2}" '
            f'y2="{y2 + NODE_H // 2}" marker-end="url(#arrow)"/>'
        )
    for n in nodes:
        kind, name = n.split(":", 1)
        x, y = at[n]
        label = name if len(name) <= 22 else name[:21] + "…"
        out.append(
            f'<g class="node {kind}"><title>{kind} {escape(name)}</title>'
            f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="6"/>'
            f'<text x="{x + NODE_W // 2}" y="{y + NODE_H // 2 + 5}">{escape(label)}</text></g>'
        )
    out.append("</svg>")
    return Markup("".join(out))


def _number(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def chart_svg(
    rows: list[dict[str, Any]], x: str, y: str, kind: str, limit: int = 200
) -> Markup | None:
    """A bar or line chart of column `y` against `x` (the first `limit` rows with a number in
    `y`); None when no row has one."""
    points = [(str(r.get(x)), v) for r in rows[:limit] if (v := _number(r.get(y))) is not None]
    if not points:
        return None
    w, h, left, bottom, top = 640, 280, 70, 40, 14
    lo, hi = min(0.0, *(v for _, v in points)), max(0.0, *(v for _, v in points))
    span = (hi - lo) or 1.0
    step = (w - left - 10) / len(points)

    def py(v: float) -> float:
        return top + (hi - v) / span * (h - top - bottom)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'viewBox="0 0 {w} {h}" width="{w}" height="{h}">',
        f"<title>{escape(kind)} chart of {escape(y)} by {escape(x)}</title>",
        f'<line class="axis" x1="{left}" y1="{py(0):.1f}" x2="{w - 10}" y2="{py(0):.1f}"/>',
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}"/>',
        f'<text class="tick" x="{left - 6}" y="{top + 4}">{hi:g}</text>',
        f'<text class="tick" x="{left - 6}" y="{h - bottom}">{lo:g}</text>',
    ]
    if kind == "line":
        path = " ".join(
            f"{'M' if i == 0 else 'L'}{left + step * (i + 0.5):.1f},{py(v):.1f}"
            for i, (_, v) in enumerate(points)
        )
        out.append(f'<path class="series" d="{path}"/>')
    else:
        for i, (label, v) in enumerate(points):
            y0, y1 = sorted((py(0), py(v)))
            out.append(
                f'<rect class="bar" x="{left + step * i + step * 0.1:.1f}" y="{y0:.1f}" '
                f'width="{step * 0.8:.1f}" height="{max(y1 - y0, 0.5):.1f}">'
                f"<title>{escape(label)}: {v:g}</title></rect>"
            )
    every = max(1, len(points) // 10)  # at most ~10 labels under the axis
    for i, (label, _) in enumerate(points):
        if i % every == 0:
            out.append(
                f'<text class="label" x="{left + step * (i + 0.5):.1f}" y="{h - bottom + 16}">'
                f"{escape(label[:12])}</text>"
            )
    out.append("</svg>")
    return Markup("".join(out))
