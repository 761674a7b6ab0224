"""Every rejected DAG file gets its specific message, naming file, job and field; hostile files
are refused by the same bounded loader on every path (parse, `trace dag validate`,
`POST /v1/dags`), and operator configs are checked before deploy."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.dags import admin, three_jobs
from trace_platform.contract import (
    MAX_EVENTS_PER_CALL,
    ClaimRequest,
    CompleteRequest,
    EventIn,
    EventsRequest,
    LeaseRef,
)
from trace_platform.dag.validate import DagInvalid, parse
from trace_platform.db.embedded import free_port
from trace_platform.lite.stack import ApiServer
from trace_platform.operators.context import OperatorContext
from trace_platform.operators.ranges import range_splitter
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
    (
        "impossible cron",
        "name: x\njobs:\n  a: {operator: noop}\ntriggers: {cron: [{name: c, schedule: '0 0 30 2 *'}]}",
        "triggers.cron[0].schedule: '0 0 30 2 *' has no fire time within 5 years",
    ),
    (
        "cron out of range",
        "name: x\njobs:\n  a: {operator: noop}\ntriggers: {cron: [{name: c, schedule: '61 * * * *'}]}",
        "'61 * * * *' is not a valid cron expression ([61 * * * *] is not acceptable, out of range)",
    ),
    (
        "sql_transform without sql",
        "name: x\njobs:\n  a: {operator: sql_transform, outputs: [{}]}",
        "jobs.a.config.sql: required field is missing",
    ),
    (
        "unknown datatype",
        "name: x\njobs:\n  ingest: {operator: cryo_ingest, config: {datatypes: [foo]}, outputs: [{}]}",
        "jobs.ingest.config.datatypes[0]: unknown datatype 'foo' (known: address_appearances",
    ),
    (
        "chunk_size 0",
        "name: x\njobs:\n  a: {operator: range_splitter, config: {chunk_size: 0}, outputs: [{}]}",
        "jobs.a.config.chunk_size: Input should be greater than or equal to 1",
    ),
    (
        "from after to",
        "name: x\njobs:\n  a: {operator: range_splitter, config: {from_block: 9, to_block: 1}, outputs: [{}]}",
        "jobs.a.config: to_block 1 is before from_block 9",
    ),
    (
        "aggregator size 0",
        "name: x\njobs:\n  a: {operator: range_aggregator, config: {size: 0}, outputs: [{}]}",
        "jobs.a.config.size: Input should be greater than or equal to 1",
    ),
    (
        "unknown config key",
        "name: x\njobs:\n  a: {operator: hot_window, config: {window: 5}, outputs: [{}]}",
        "jobs.a.config.window: unknown field",
    ),
    (
        "deep yaml",
        "name: x\njobs: {a: {operator: noop, config: {x: " + "[" * 100_000 + "}}}",
        "document nests deeper than 64 levels",
    ),
]


def alias_bomb(levels: int = 9) -> str:
    """Some 600 bytes, 10^9 nodes once its aliases are expanded."""
    lines = ["name: bomb", "jobs:", "  a:", "    operator: noop", "    config:"]
    lines.append("      l0: &l0 [x, x, x, x, x, x, x, x, x, x]")
    for i in range(1, levels):
        lines.append(f"      l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]")
    return "\n".join(lines) + "\n"


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


# -- the same checks on every path ----------------------------------------------------------


@pytest.fixture
def api(services: Services) -> Iterator[httpx.Client]:
    server = ApiServer(services, "127.0.0.1", free_port(), background=False)
    server.start()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client
    server.stop()


HOSTILE = [
    ("alias bomb", alias_bomb(), "document has more than 20,000 nodes once its aliases"),
    (
        "100k deep",
        "name: x\njobs: {a: {operator: noop, config: {x: " + "[" * 100_000 + "]" * 100_000 + "}}}",
        "document nests deeper than 64 levels",
    ),
    ("big", "name: x\n#" + "x" * 300_000 + "\n", "the limit is 262,144 (256 KiB)"),
    (
        "bad configs",
        "name: x\njobs:\n  a: {operator: sql_transform, outputs: [{}]}\n"
        "  b: {operator: range_splitter, config: {chunk_size: 0}, outputs: [{}]}\n",
        "jobs.a.config.sql: required field is missing; "
        "<request>: jobs.b.config.chunk_size: Input should be greater than or equal to 1",
    ),
    (
        "impossible cron",
        "name: x\njobs:\n  a: {operator: noop}\n"
        "triggers: {cron: [{name: c, schedule: '0 0 30 2 *'}]}\n",
        "has no fire time within 5 years",
    ),
]


@pytest.mark.parametrize(("case", "text", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_post_dags_refuses_hostile_files_with_422_and_stores_nothing(
    api: httpx.Client, services: Services, case: str, text: str, message: str
) -> None:
    before = _state(services)
    started = time.monotonic()
    r = api.post("/v1/dags", json={"yaml": text})
    # A bound on a blow-up (a parser that expanded the document would take minutes), not a
    # speed figure: generous enough for a busy 2-core machine.
    assert time.monotonic() - started < 60
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "invalid_dag" and message in body["message"], body
    assert _state(services) == before
    ok = api.post("/v1/dags", json={"yaml": three_jobs("after")})  # still serving
    assert ok.status_code == 201, ok.text


def test_dag_validate_cli_applies_the_same_checks(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    configs = tmp_path / "configs.yaml"
    configs.write_text(HOSTILE[3][1])
    good = tmp_path / "good.yaml"
    good.write_text(three_jobs("good"))
    files = [str(bomb), str(configs), str(good)]
    out = subprocess.run(
        [sys.executable, "-m", "trace_platform.cli.main", "dag", "validate", *files],
        env={**os.environ, "COLUMNS": "300", "TRACE_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert f"{bomb}: document has more than 20,000 nodes once its aliases are expanded" in lines
    assert f"{configs}: jobs.a.config.sql: required field is missing" in lines
    assert (
        f"{configs}: jobs.b.config.chunk_size: Input should be greater than or equal to 1" in lines
    )
    assert any(line.startswith("ok ") and "good.yaml" in line for line in lines), lines


def test_deploy_refuses_a_schedule_that_cannot_fire(services: Services) -> None:
    before = _state(services)
    impossible = three_jobs("never").replace('"* * * * *"', '"0 0 31 4 *"')  # 31 April
    with pytest.raises(DagInvalid, match="'0 0 31 4 \\*' has no fire time within 5 years"):
        services.control.deploy(admin(services), impossible, "never.yaml")
    assert _state(services) == before


SPLIT = """
name: split
jobs:
  backfill:
    operator: range_splitter
    config: {from_block: 0, to_block: 1500, chunk_size: 1}
    outputs: [{}]
  sink:
    operator: noop
    inputs: [{job: backfill}]
"""


def test_range_splitter_emits_more_than_one_call_carries_through_the_dispatcher(
    services: Services,
) -> None:
    """1,501 ranges: the earlier ones as mid-task events (one call each, as the wrapper sends
    them), the last 1,000 with the completion; every range lands once and wakes its task."""
    d, me = services.dispatcher, admin(services)
    services.control.deploy(me, SPLIT)
    (task_id,) = services.control.trigger(me, "split")["tasks"]
    claim = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
    lease = {"task_id": task_id, "attempt": claim.attempt, "lease_token": claim.lease_token}
    payload = d.fetch(LeaseRef(**lease))
    calls = 0

    def send(msg: dict[str, Any]) -> None:
        nonlocal calls
        if msg["type"] == "event":
            calls += 1
            d.events(EventsRequest(**lease, events=[EventIn.model_validate(msg["event"])]))

    ctx = OperatorContext(task=payload, workdir=Path("/nonexistent"), _send=send)
    final = range_splitter(ctx)
    done = d.complete(CompleteRequest(**lease, outcome="succeeded", final_events=final))
    assert done.status == "succeeded" and calls == 501 and len(final) == MAX_EVENTS_PER_CALL
    with services.pool.connection() as conn:
        ranges = conn.execute(
            "SELECT range_start AS s, range_end AS e FROM events WHERE producer_task_id = %s",
            [task_id],
        ).fetchall()
        sinks = conn.execute(
            "SELECT count(*) AS n FROM task_registry WHERE job = 'sink' AND parent_task_id = %s",
            [task_id],
        ).fetchone()
    assert sorted((r["s"], r["e"]) for r in ranges) == [(i, i + 1) for i in range(1501)]
    assert sinks is not None and sinks["n"] == 1501


@pytest.mark.slow
def test_range_splitter_over_the_limit_through_a_real_worker(settings: Any, dsn: str) -> None:
    """The same request through the Lite stack (worker wrapper, sandboxed operator host, HTTP
    internal API): the task succeeds rather than dying as a lost lease."""
    from tests.support.dags import finished_run
    from trace_platform.lite.stack import LiteStack

    only = SPLIT.split("  sink:")[0]
    with LiteStack(
        settings, workers=1, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"}
    ) as stack:
        svc, me = stack.services, admin(stack.services)
        svc.control.deploy(me, only)
        run_id = svc.control.trigger(me, "split")["run_id"]
        (task,) = finished_run(svc, run_id, 300)
        assert task["status"] == "succeeded", task["last_error"]
        with svc.pool.connection() as conn:
            row = conn.execute(
                "SELECT count(DISTINCT dedupe_key) AS n FROM events WHERE producer_task_id = %s",
                [task["task_id"]],
            ).fetchone()
        assert row is not None and row["n"] == 1501
