"""DAG files are untrusted: the loader's limits hold, each refusal names its limit, and no
document makes parsing slow, huge, or a RecursionError."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trace_platform.dag import loader
from trace_platform.dag.validate import MAX_PROBLEMS, MAX_SPEC_BYTES, DagInvalid, load, parse

# Expanding a bomb would take hours or all memory; refusing it takes milliseconds. The bound is
# loose so a loaded CI machine cannot make it flaky, and still tells the two apart.
CHEAP_SECONDS = 30

HEAD = "name: x\njobs:\n  a:\n    operator: noop\n    config:\n"


def alias_bomb(levels: int) -> str:
    """The classic: each level is a list repeating the level below ten times (10^levels
    nodes once expanded, a few hundred bytes written)."""
    lines = ["      l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"      l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]")
    return HEAD + "\n".join(lines) + "\n"


def refused(text: str, source: str = "bad.yaml") -> str:
    started = time.monotonic()
    with pytest.raises(DagInvalid) as e:
        parse(text, source)
    assert time.monotonic() - started < CHEAP_SECONDS, "refusing a hostile document must stay cheap"
    rendered = str(e.value)
    assert rendered.startswith(f"{source}: "), rendered
    return rendered


def test_an_alias_bomb_is_refused_at_once() -> None:
    text = alias_bomb(9)  # 10^9 nodes expanded
    assert len(text) < 1000
    started = time.monotonic()
    msg = refused(text)
    assert time.monotonic() - started < CHEAP_SECONDS
    assert f"more than {loader.MAX_NODES:,} nodes once its aliases are expanded" in msg


def test_aliases_within_the_budget_still_work() -> None:
    spec = parse(
        "name: x\nworker_pools:\n  p: [&slot {env: {A: b}}, *slot]\n"
        "jobs:\n  a: {operator: noop, worker_pool: p, config: {x: &v [1, 2], y: *v}}\n"
    )
    assert spec.worker_pools["p"][1].env == {"A": "b"}
    assert spec.jobs["a"].config == {"x": [1, 2], "y": [1, 2]}
    assert len(parse(alias_bomb(3)).jobs["a"].config["l2"]) == 10  # 1,000 nodes: fine


def test_the_alias_budget() -> None:
    uses = ", ".join(["*s"] * (loader.MAX_ALIASES + 1))
    msg = refused(HEAD + f"      s: &s 1\n      l: [{uses}]\n")
    assert f"document uses more than {loader.MAX_ALIASES} aliases" in msg


@pytest.mark.parametrize("depth", [65, 200, 1000, 100_000])
def test_deep_nesting_is_refused_never_a_recursion_error(depth: int) -> None:
    flow = HEAD + "      x: " + "[" * depth + "]" * depth + "\n"
    assert "bad.yaml: document nests deeper than 64 levels" in refused(flow)
    if depth <= 200:  # deeper block documents are over the size limit first
        block = HEAD + "".join("  " * (3 + i) + f"k{i}:\n" for i in range(depth))
        assert "document nests deeper than 64 levels" in refused(block)


def test_nesting_at_the_limit_is_fine() -> None:
    # jobs, a, config are 3 levels under the document's mapping: 60 more make 64.
    inner = 64 - 4
    spec = parse(HEAD + "      x: " + "[" * inner + "]" * inner + "\n")
    assert "x" in spec.jobs["a"].config


def test_nesting_through_aliases_counts_too() -> None:
    lines = ["      d0: &d0 " + "[" * 30 + "]" * 30]
    for i in range(1, 4):
        lines.append(f"      d{i}: &d{i} " + "[" * 20 + f"*d{i - 1}" + "]" * 20)
    msg = refused(HEAD + "\n".join(lines) + "\n")
    assert "nests deeper than 64 levels once its aliases are expanded" in msg


def test_node_count() -> None:
    items = ",".join(["1"] * (loader.MAX_NODES + 10))
    assert f"document has more than {loader.MAX_NODES:,} nodes" in refused(
        HEAD + f"      x: [{items}]\n"
    )


def test_document_size() -> None:
    msg = refused("name: x\n# " + "x" * loader.MAX_DOCUMENT_BYTES + "\n")
    assert "bytes; the limit is 262,144 (256 KiB)" in msg


def test_load_reads_no_more_than_the_limit(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n# " + "x" * (4 * loader.MAX_DOCUMENT_BYTES) + "\n")
    with pytest.raises(DagInvalid, match=r"big.yaml: document is 1,048,587 bytes; the limit"):
        load(big)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(DagInvalid, match="not UTF-8"):
        load(binary)


def test_repeated_text_through_aliases() -> None:
    s = "y" * 100_000
    uses = ", ".join(["*s"] * 20)
    msg = refused(HEAD + f"      s: &s '{s}'\n      l: [{uses}]\n")
    assert "more than 1024 KiB of text once its aliases are expanded" in msg


@pytest.mark.parametrize(
    "config", ["&c {x: *c}", "{x: &c [1, *c]}", "&c [[[*c]]]", "{a: &c {b: [*c]}}"]
)
def test_recursive_structures_are_refused(config: str) -> None:
    msg = refused(f"name: x\njobs:\n  a: {{operator: noop, config: {config}}}\n")
    assert "an alias refers to a collection that contains it" in msg


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1" * 5000, "invalid YAML: Exceeds the limit (4300 digits)"),
        ("2001-13-45", "invalid YAML: month must be in 1..12"),
        ("{? [a, b] : c}", "a mapping key must be a plain value"),
        ("!!python/object:os.system {}", "invalid YAML"),
        ("*undefined", "invalid YAML: found undefined alias"),
    ],
)
def test_values_python_would_choke_on_are_dag_problems(value: str, message: str) -> None:
    assert message in refused(f"name: x\njobs:\n  a: {{operator: noop, config: {{x: {value}}}}}\n")


def test_two_documents_and_empty_ones() -> None:
    assert "but found another document" in refused("name: x\n---\nname: y\n")
    assert "a DAG file must be a YAML mapping" in refused("")


def test_stored_spec_is_capped() -> None:
    # Within every loader limit (under 80 KiB, under 20,000 nodes), but every `{}` output is
    # stored with its defaults: the spec would be far bigger than the file.
    outputs = ", ".join(["{}"] * 19_000)
    text = f"name: x\njobs:\n  a: {{operator: noop, outputs: [{outputs}]}}\n"
    assert len(text) < loader.MAX_DOCUMENT_BYTES
    msg = refused(text)
    assert "the DAG's stored spec would be" in msg, msg
    assert f"the limit is {MAX_SPEC_BYTES:,} (1024 KiB)" in msg


def test_problems_reported_are_bounded() -> None:
    jobs = "".join(f"  j{i}: {{operator: teleport}}\n" for i in range(MAX_PROBLEMS + 50))
    with pytest.raises(DagInvalid) as e:
        parse("name: x\njobs:\n" + jobs)
    assert len(e.value.problems) == MAX_PROBLEMS + 1
    assert e.value.problems[-1].message == "… and 50 more problems"


def test_the_largest_acceptable_document_parses_in_reasonable_time() -> None:
    items = "".join("        - 1\n" for _ in range(loader.MAX_NODES - 100))
    text = HEAD + "      x:\n" + items
    assert len(text) < loader.MAX_DOCUMENT_BYTES
    started = time.monotonic()
    parse(text)
    assert time.monotonic() - started < CHEAP_SECONDS
