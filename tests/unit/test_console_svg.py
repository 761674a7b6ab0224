"""The console's server-drawn pictures and lineage: a DAG's graph puts a published output
between its producer and its readers, lineage goes only through readable datasets, and a
chart escapes what it labels."""

from __future__ import annotations

from trace_platform.console.lineage import lineage
from trace_platform.console.svg import chart_svg, dag_graph, graph_svg

SPEC = {
    "jobs": {
        "source": {"outputs": [{}]},
        "transform": {"inputs": [{"job": "source", "output": 0}], "outputs": [{}, {}]},
        "sink": {"inputs": [{"job": "transform", "output": 1}]},
    },
    "publish": [
        {"job": "source", "output_index": 0, "dataset": "raw"},
        {"job": "transform", "output_index": 0, "dataset": "clean"},
    ],
}
READER = {
    "jobs": {"use": {"inputs": [{"from": {"dataset": "clean"}}], "outputs": [{}]}},
    "publish": [{"job": "use", "output_index": 0, "dataset": "report"}],
}


def test_a_published_output_sits_between_its_producer_and_its_readers() -> None:
    nodes, edges = dag_graph(SPEC)
    assert set(edges) == {
        ("job:source", "dataset:raw"),
        ("dataset:raw", "job:transform"),
        ("job:transform", "dataset:clean"),
        ("job:transform", "job:sink"),  # output 1 is not published
    }
    svg = graph_svg(nodes, edges, "<b>")
    assert "<title>&lt;b&gt;</title>" in svg and svg.count('class="edge"') == 4


def test_lineage_crosses_dags_but_only_through_readable_datasets() -> None:
    specs = {"hello": SPEC, "reader": READER}
    everything = {"raw", "clean", "report"}
    assert lineage(specs, "raw", everything) == {"upstream": [], "downstream": ["clean", "report"]}
    assert lineage(specs, "report", everything) == {"upstream": ["clean", "raw"], "downstream": []}
    assert lineage(specs, "raw", {"raw", "clean"})["downstream"] == ["clean"]


def test_a_chart_draws_numbers_and_escapes_labels() -> None:
    rows = [{"k": "<script>", "n": 2}, {"k": "b", "n": "x"}, {"k": "c", "n": -1}]
    bar = chart_svg(rows, "k", "n", "bar")
    assert bar is not None and bar.count('class="bar"') == 2 and "<script>" not in bar
    line = chart_svg(rows, "k", "n", "line")
    assert line is not None and 'class="series"' in line
    assert chart_svg([{"k": "a", "n": None}], "k", "n", "bar") is None
