"""Operator configs: one pydantic model per operator, checked at deploy (every problem at once,
like the rest of the file) and read through the same model when the operator runs."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from trace_platform.contract import (
    MAX_EVENTS_PER_CALL,
    CompleteRequest,
    DatasetRef,
    EventIn,
    EventsRequest,
    TaskPayload,
)
from trace_platform.dag.validate import DagInvalid, parse
from trace_platform.operators import CONFIGS, REGISTRY, TESTING, config_model
from trace_platform.operators.config import OperatorConfig
from trace_platform.operators.context import OperatorContext, PermanentError
from trace_platform.operators.cryo_ingest import KNOWN_DATATYPES
from trace_platform.operators.ranges import (
    MAX_RANGES_PER_REQUEST,
    range_aggregator,
    range_splitter,
)


def test_every_operator_declares_a_config_model() -> None:
    assert set(CONFIGS) == set(REGISTRY) | set(TESTING)
    for name in CONFIGS:
        model = config_model(name)
        assert model is not None and issubclass(model, OperatorConfig), name
        assert model.model_json_schema()  # documentable


def test_unknown_operators_have_no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_model("teleport") is None
    monkeypatch.delenv("TRACE_OPERATOR_REGISTRY")
    assert config_model("noop") is None  # not an operator this process may run


def problems(text: str) -> list[str]:
    with pytest.raises(DagInvalid) as e:
        parse(text, "bad.yaml")
    return [p.render("bad.yaml") for p in e.value.problems]


BAD_CONFIGS = """
name: bad
jobs:
  backfill:
    operator: range_splitter
    config: {from_block: 0, to_block: 99, chunk_size: 0}
    outputs: [{}]
  reversed:
    operator: range_splitter
    config: {from_block: 100, to_block: 5}
    outputs: [{}]
  ingest:
    operator: cryo_ingest
    config: {datatypes: [logs, foo, blocks], rpc_url: "http://x", extra_thing: 1}
    inputs: [{job: backfill}]
    outputs: [{}, {}, {}]
  windows:
    operator: range_aggregator
    config: {size: 0}
    inputs: [{job: ingest}]
    outputs: [{}]
  no_sql:
    operator: sql_transform
    inputs: [{job: windows}]
    outputs: [{}]
  hot:
    operator: hot_window
    config: {window_blocks: 0}
    inputs: [{job: ingest, output: 0}]
    outputs: [{backend: postgres}]
"""


def test_every_config_problem_is_reported_at_once_with_its_field() -> None:
    got = problems(BAD_CONFIGS)
    known = ", ".join(sorted(KNOWN_DATATYPES))
    assert got == [
        "bad.yaml: jobs.backfill.config.chunk_size: Input should be greater than or equal to 1",
        "bad.yaml: jobs.reversed.config: to_block 5 is before from_block 100 (both inclusive)",
        f"bad.yaml: jobs.ingest.config.datatypes[1]: unknown datatype 'foo' (known: {known})",
        "bad.yaml: jobs.ingest.config.extra_thing: unknown field",
        "bad.yaml: jobs.windows.config.size: Input should be greater than or equal to 1",
        "bad.yaml: jobs.no_sql.config.sql: required field is missing",
        "bad.yaml: jobs.hot.config.window_blocks: Input should be greater than or equal to 1",
    ]


def test_config_problems_come_with_the_files_other_problems() -> None:
    got = problems(
        "name: x\njobs:\n"
        "  a: {operator: sql_transform, timeout_secnds: 5, outputs: [{}]}\n"
        "  b: {operator: range_aggregator, config: {size: -1}, worker_pool: nowhere}\n"
    )
    assert got == [
        "bad.yaml: jobs.a.timeout_secnds: unknown field",
        "bad.yaml: jobs.a.config.sql: required field is missing",
        "bad.yaml: jobs.b.config.size: Input should be greater than or equal to 1",
    ]
    got = problems(
        "name: x\njobs:\n  a: {operator: teleport}\n"
        "  b: {operator: range_aggregator, config: {size: -1}, worker_pool: nowhere}\n"
    )
    assert len(got) == 3 and "unknown operator 'teleport'" in got[0]
    assert "jobs.b.config.size" in got[1] and "jobs.b.worker_pool" in got[2]


def test_configs_against_the_jobs_shape() -> None:
    got = problems(
        "name: x\njobs:\n"
        "  split: {operator: range_splitter, config: {from_block: 0, to_block: 9}}\n"
        "  ingest: {operator: cryo_ingest, config: {datatypes: [logs, blocks]}, "
        "inputs: [{job: split}], outputs: [{}]}\n"
        "  sql: {operator: sql_transform, config: {sql: 'SELECT 1'}, inputs: [{job: ingest}]}\n"
    )
    assert got == [
        "bad.yaml: jobs.split.outputs: range_splitter needs one output to emit its manifests on",
        "bad.yaml: jobs.ingest.config.datatypes: 2 datatypes but 1 outputs: one output per "
        "datatype, in order",
        "bad.yaml: jobs.ingest.inputs[0].output: job 'split' has 0 output(s); index 0 does not exist",
        "bad.yaml: jobs.sql.outputs: sql_transform needs one output",
    ]


def test_a_request_too_big_for_one_run_is_refused_at_deploy() -> None:
    (msg,) = problems(
        "name: x\njobs:\n  s: {operator: range_splitter, "
        "config: {from_block: 0, to_block: 10000000, chunk_size: 1}, outputs: [{}]}\n"
    )
    assert "makes 10,000,001 ranges; one request makes at most 100,000" in msg


def test_the_examples_and_the_demo_pass() -> None:
    from trace_platform.lite.demo import DemoPlan, dag_text

    for f in sorted(Path("examples/dags").glob("*.yaml")):
        parse(f.read_text(), str(f))
    plan = DemoPlan(
        rpc_url="http://127.0.0.1:8545",
        token="0x" + "11" * 20,
        from_block=0,
        to_block=1999,
        chunk_size=500,
        network="devnet",
        window_blocks=100,
        hot_blocks=500,
    )
    parse(dag_text(plan), "demo")


# -- run time: the same model, a PermanentError naming the problem ---------------------------


def context(
    operator: str,
    config: dict[str, Any],
    tmp_path: Path,
    *,
    input_event: dict[str, Any] | None = None,
    outputs: int = 1,
    send: Any = None,
) -> OperatorContext:
    task = TaskPayload.model_construct(
        task_id=uuid.uuid4(),
        attempt=1,
        job="j",
        operator=operator,
        config=config,
        input_event=input_event,
        inputs=[],
        outputs=[DatasetRef(dataset_uuid=uuid.uuid4()) for _ in range(outputs)],
        operator_state=None,
    )
    return OperatorContext(task=task, workdir=tmp_path, _send=send or (lambda msg: None))


def test_run_time_reads_go_through_the_model(tmp_path: Path) -> None:
    with pytest.raises(PermanentError, match="range_aggregator config: size: required field"):
        range_aggregator(
            context("range_aggregator", {}, tmp_path, input_event={"range": {"start": 0, "end": 5}})
        )
    with pytest.raises(PermanentError, match="chunk_size: Input should be greater than"):
        range_splitter(context("range_splitter", {"from_block": 0, "chunk_size": 0}, tmp_path))


def test_the_run_config_overrides_and_is_checked_with_the_same_model(tmp_path: Path) -> None:
    job = {"from_block": 0, "to_block": 9, "chunk_size": 5}
    run = {"config": {"from_block": 20, "to_block": 10, "scheduled_for": "2026-01-01T00:00:00"}}
    with pytest.raises(PermanentError, match="to_block 10 is before from_block 20"):
        range_splitter(context("range_splitter", job, tmp_path, input_event=run))
    run = {"config": {"chunk_size": 0}}
    with pytest.raises(PermanentError, match="chunk_size: Input should be greater"):
        range_splitter(context("range_splitter", job, tmp_path, input_event=run))
    with pytest.raises(PermanentError, match="to_block: required"):
        range_splitter(context("range_splitter", {"from_block": 0}, tmp_path))
    run = {"config": {"to_block": 19, "scheduled_for": "x", "skipped_ticks": 3}}  # others ignored
    events = range_splitter(context("range_splitter", job, tmp_path, input_event=run))
    assert [(e.range.start, e.range.end) for e in events if e.range] == [
        (0, 5),
        (5, 10),
        (10, 15),
        (15, 20),
    ]
    big = {"config": {"to_block": MAX_RANGES_PER_REQUEST * 5, "chunk_size": 1}}
    with pytest.raises(PermanentError, match="one request makes at most 100,000"):
        range_splitter(context("range_splitter", job, tmp_path, input_event=big))


def test_range_splitter_batches_what_one_call_cannot_carry(tmp_path: Path) -> None:
    """0..1500 in chunks of 1 is 1,501 ranges: each call stays within the Dispatcher's limit
    (the wrapper forwards a mid-task event as one call; the completion carries the rest). The
    same through a real Dispatcher: tests/integration/test_dag_files.py."""
    lease = {"task_id": uuid.uuid4(), "attempt": 1, "lease_token": uuid.uuid4()}
    calls: list[EventsRequest] = []

    def send(msg: dict[str, Any]) -> None:
        if msg["type"] == "event":  # validated as the wrapper and the Dispatcher do
            calls.append(EventsRequest(**lease, events=[EventIn(**msg["event"])]))

    cfg = {"from_block": 0, "to_block": 1500, "chunk_size": 1}
    final = range_splitter(context("range_splitter", cfg, tmp_path, send=send))
    done = CompleteRequest(**lease, outcome="succeeded", final_events=final)
    assert len(done.final_events) == MAX_EVENTS_PER_CALL
    mid = [e for c in calls for e in c.events]
    ranges = [(e.range.start, e.range.end) for e in [*mid, *done.final_events] if e.range]
    assert ranges == [(i, i + 1) for i in range(1501)]  # each once, in order
