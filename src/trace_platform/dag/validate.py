"""Loads a DAG file and reports every problem at once, each naming the file, job and field.

Every DAG text goes through `parse` (`trace dag validate`, deploy, `POST /v1/dags`): the bounded
loader (`dag/loader.py`: document size, nesting, nodes, aliases), the file's schema, each job's
operator config against that operator's model, the graph checks, and the size of the spec as
it would be stored (MAX_SPEC_BYTES)."""

from __future__ import annotations

import graphlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trace_platform.dag.loader import MAX_DOCUMENT_BYTES, YamlRefused, load_yaml
from trace_platform.dag.schema import NAME, DagSpec, JobOutputRef, PublishSpec, SharedRead
from trace_platform.dag.whole import writes_whole
from trace_platform.operators import TRUSTED_OPERATORS, config_model, registry
from trace_platform.operators import config as op_config

MAX_SPEC_BYTES = 1024 * 1024  # the spec as stored (JSON), whatever the YAML looked like
MAX_PROBLEMS = 200  # reported at once; a hostile file cannot make the answer unbounded

_UNION_TAGS = {"job", "shared"}


@dataclass(frozen=True)
class DagProblem:
    where: str
    message: str

    def render(self, source: str) -> str:
        return (
            f"{source}: {self.where}: {self.message}" if self.where else f"{source}: {self.message}"
        )


class DagInvalid(ValueError):
    def __init__(self, source: str, problems: list[DagProblem]) -> None:
        if len(problems) > MAX_PROBLEMS:
            more = len(problems) - MAX_PROBLEMS
            problems = [*problems[:MAX_PROBLEMS], DagProblem("", f"… and {more} more problems")]
        self.source = source
        self.problems = problems
        super().__init__("\n".join(p.render(source) for p in problems))


def _pydantic_problems(err: ValidationError) -> list[DagProblem]:
    """The schema's problems, located as the file spells them (the union tags pydantic puts in
    a location are not part of the file)."""
    return [
        DagProblem(
            op_config.where(tuple(p for p in e["loc"] if p not in _UNION_TAGS)),
            op_config.message(e),
        )
        for e in err.errors()
    ]


def parse(text: str, source: str = "<dag>") -> DagSpec:
    """YAML text -> a DagSpec that passed every file-local check, or DagInvalid with them all."""
    try:
        raw = load_yaml(text)
    except YamlRefused as e:
        raise DagInvalid(source, [DagProblem(e.where, e.message)]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise DagInvalid(source, [DagProblem(where, f"invalid YAML: {problem}")]) from None
    if not isinstance(raw, dict):
        raise DagInvalid(
            source, [DagProblem("", "a DAG file must be a YAML mapping (name, jobs, …)")]
        )
    try:
        spec = DagSpec.model_validate(raw)
    except ValidationError as e:
        # The operator configs are checked too, so one run shows every problem of the file.
        raise DagInvalid(source, _pydantic_problems(e) + _raw_config_problems(raw)) from None
    problems = check(spec)
    if not problems:
        problems = spec_size_problems(spec)
    if problems:
        raise DagInvalid(source, problems)
    return spec


def spec_size_problems(spec: DagSpec) -> list[DagProblem]:
    """The spec as deploy stores it must fit MAX_SPEC_BYTES."""
    size = len(json.dumps(spec.model_dump(mode="json", by_alias=True)).encode())
    if size <= MAX_SPEC_BYTES:
        return []
    return [
        DagProblem(
            "",
            f"the DAG's stored spec would be {size:,} bytes; the limit is {MAX_SPEC_BYTES:,} "
            f"({MAX_SPEC_BYTES // 1024} KiB)",
        )
    ]


def load(path: Path) -> DagSpec:
    """A DAG file: read no more than the loader accepts, then `parse`."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)
            size = max(len(data), os.fstat(f.fileno()).st_size)
    except OSError as e:
        raise DagInvalid(str(path), [DagProblem("", f"cannot read file: {e.strerror}")]) from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise DagInvalid(
            str(path),
            [
                DagProblem(
                    "",
                    f"document is {size:,} bytes; the limit is {MAX_DOCUMENT_BYTES:,} "
                    f"({MAX_DOCUMENT_BYTES // 1024} KiB)",
                )
            ],
        )
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise DagInvalid(
            str(path), [DagProblem("", f"cannot read file: not UTF-8 (byte {e.start})")]
        ) from None
    return parse(text, str(path))


def job_config_problems(
    at: str, operator: str, config: dict[str, Any], inputs: int | None, outputs: int | None
) -> list[DagProblem]:
    """A job's config checked with its operator's config model (nothing for an unknown
    operator, reported elsewhere); with the job's shape when it is known."""
    model = config_model(operator)
    if model is None:
        return []
    try:
        cfg = model.model_validate(config)
    except ValidationError as e:
        return [
            DagProblem(f"{at}.config.{where}" if where else f"{at}.config", msg)
            for where, msg in op_config.problems(e)
        ]
    if inputs is None or outputs is None:
        return []
    return [
        DagProblem(f"{at}.{where}" if where else at, msg)
        for where, msg in cfg.job_problems(inputs, outputs)
    ]


def _raw_config_problems(raw: dict[str, Any]) -> list[DagProblem]:
    """Config problems of a file that failed its schema: every job whose operator and config
    are at least the right types."""
    jobs = raw.get("jobs")
    if not isinstance(jobs, dict):
        return []
    out: list[DagProblem] = []
    for name, job in jobs.items():
        if not isinstance(job, dict):
            continue
        operator, config = job.get("operator"), job.get("config", {})
        if isinstance(name, str) and isinstance(operator, str) and isinstance(config, dict):
            inputs, outputs = job.get("inputs", []), job.get("outputs", [])
            out += job_config_problems(
                f"jobs.{name}",
                operator,
                config,
                len(inputs) if isinstance(inputs, list) else None,
                len(outputs) if isinstance(outputs, list) else None,
            )
    return out


def check(spec: DagSpec) -> list[DagProblem]:
    """Graph-level checks pydantic cannot express."""
    problems: list[DagProblem] = []
    add = problems.append
    graph: dict[str, set[str]] = {}
    for name, job in spec.jobs.items():
        at = f"jobs.{name}"
        if not NAME.fullmatch(name):
            add(DagProblem(at, f"job name '{name}' must match ^[a-z][a-z0-9_]{{0,127}}$"))
        if job.operator not in (known := registry()):
            add(
                DagProblem(
                    f"{at}.operator",
                    f"unknown operator '{job.operator}' (known: {', '.join(sorted(known))})",
                )
            )
        else:
            problems += job_config_problems(
                at, job.operator, job.config, len(job.inputs), len(job.outputs)
            )
            if job.operator in TRUSTED_OPERATORS and job.runtime != "ecs_platform":
                # Elsewhere it would run in the untrusted host, with its slot's env.
                add(
                    DagProblem(
                        f"{at}.runtime",
                        f"{job.operator} is a trusted platform operator: it runs only as "
                        "runtime ecs_platform",
                    )
                )
        if job.worker_pool is not None and job.worker_pool not in spec.worker_pools:
            add(
                DagProblem(
                    f"{at}.worker_pool",
                    f"worker pool '{job.worker_pool}' is not defined in worker_pools",
                )
            )
        if writes_whole(job) and job.scaling.max_concurrency > 1:  # see dag/whole.py
            add(
                DagProblem(
                    f"{at}.scaling.max_concurrency",
                    f"job '{name}' ({job.operator}) rewrites its output whole as one scope "
                    "(`all`, the last commit wins), so two runs at once could land the older "
                    "read last and lose data: it runs one at a time (max_concurrency: 1)",
                )
            )
        graph[name] = set()
        if job.inputs and not any(inp.triggers for inp in job.inputs):
            add(
                DagProblem(
                    f"{at}.inputs",
                    "every input has triggers: false, so nothing would ever start this job",
                )
            )
        for i, inp in enumerate(job.inputs):
            if isinstance(inp, JobOutputRef):
                up = spec.jobs.get(inp.job)
                if up is None:
                    add(
                        DagProblem(
                            f"{at}.inputs[{i}].job",
                            f"references job '{inp.job}' which does not exist",
                        )
                    )
                elif inp.output >= len(up.outputs):
                    add(
                        DagProblem(
                            f"{at}.inputs[{i}].output",
                            f"job '{inp.job}' has {len(up.outputs)} output(s); index {inp.output} does not exist",
                        )
                    )
                else:
                    graph[name].add(inp.job)
            elif isinstance(inp, SharedRead) and inp.from_.dataset in {
                p.dataset for p in spec.publish
            }:
                add(
                    DagProblem(
                        f"{at}.inputs[{i}].from.dataset",
                        f"'{inp.from_.dataset}' is published by this DAG: wire it by index ({{job, output}})",
                    )
                )
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        cycle = " -> ".join(reversed(e.args[1]))
        add(DagProblem("jobs", f"the jobs form a cycle: {cycle}"))
    seen_names: dict[str, int] = {}
    seen_outputs: dict[tuple[str, int], int] = {}
    for i, pub in enumerate(spec.publish):
        at = f"publish[{i}]"
        job = spec.jobs.get(pub.job)
        if job is None:
            add(DagProblem(f"{at}.job", f"publishes job '{pub.job}' which does not exist"))
        elif pub.output_index >= len(job.outputs):
            add(
                DagProblem(
                    f"{at}.output_index", f"job '{pub.job}' has no output {pub.output_index}"
                )
            )
        if not NAME.fullmatch(pub.dataset):
            add(
                DagProblem(
                    f"{at}.dataset",
                    f"dataset name '{pub.dataset}' must match ^[a-z][a-z0-9_]{{0,127}}$",
                )
            )
        if pub.dataset in seen_names:
            add(
                DagProblem(
                    f"{at}.dataset",
                    f"dataset '{pub.dataset}' is already published by publish[{seen_names[pub.dataset]}]",
                )
            )
        seen_names.setdefault(pub.dataset, i)
        key = (pub.job, pub.output_index)
        if key in seen_outputs:
            add(
                DagProblem(
                    at,
                    f"output {pub.output_index} of job '{pub.job}' is already published by publish[{seen_outputs[key]}]",
                )
            )
        seen_outputs.setdefault(key, i)
    by_name = {p.dataset: p for p in spec.publish}
    windowed: dict[str, int] = {}
    for i, pub in enumerate(spec.publish):
        if pub.hot_window is None:
            continue
        at = f"publish[{i}].hot_window"
        if pub.hot_window.of in windowed:
            add(
                DagProblem(
                    f"{at}.of",
                    f"'{pub.hot_window.of}' already has a hot window (publish[{windowed[pub.hot_window.of]}])",
                )
            )
        windowed.setdefault(pub.hot_window.of, i)
        cold = by_name.get(pub.hot_window.of)
        if cold is None:
            add(
                DagProblem(f"{at}.of", f"'{pub.hot_window.of}' is not a dataset this DAG publishes")
            )
            continue
        if _backend(spec, pub) != "postgres":
            add(
                DagProblem(
                    at, "a hot window is a Postgres dataset: its output needs backend: postgres"
                )
            )
        if _backend(spec, cold) != "parquet":
            add(
                DagProblem(
                    f"{at}.of", f"'{cold.dataset}' must be a Parquet dataset (the cold history)"
                )
            )
        if cold.hot_window is not None:
            add(DagProblem(f"{at}.of", f"'{cold.dataset}' is itself a hot window"))
    for pool, slots in spec.worker_pools.items():
        if not NAME.fullmatch(pool):
            add(DagProblem(f"worker_pools.{pool}", "pool names must match ^[a-z][a-z0-9_]{0,127}$"))
        if not slots:
            add(DagProblem(f"worker_pools.{pool}", "a worker pool needs at least one slot"))
    names = [t.name for t in spec.triggers.cron] + [t.name for t in spec.triggers.webhooks]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        add(DagProblem("triggers", f"trigger name '{dup}' is used twice"))
    if names and not any(not j.inputs for j in spec.jobs.values()):
        add(
            DagProblem(
                "triggers", "the DAG has triggers but no source job (a job without inputs) to start"
            )
        )
    problems.extend(_buffered_problems(spec))
    return problems


def _buffered_problems(spec: DagSpec) -> list[DagProblem]:
    """Buffered datasets' names: once each, and not also a name this file publishes. Whether
    a job may write one is checked at deploy (it may be another DAG's)."""
    out: list[DagProblem] = []
    published = {p.dataset for p in spec.publish}
    seen: set[str] = set()
    for i, b in enumerate(spec.buffered):
        if b.name in seen or b.name in published:
            out.append(DagProblem(f"buffered[{i}].name", f"dataset name '{b.name}' is used twice"))
        seen.add(b.name)
    for name, job in spec.jobs.items():
        for i, b in enumerate(job.buffer_outputs):
            if not NAME.fullmatch(b):
                out.append(
                    DagProblem(f"jobs.{name}.buffer_outputs[{i}]", f"'{b}' is not a dataset name")
                )
    return out


def source_jobs(spec: DagSpec) -> list[str]:
    return [name for name, job in spec.jobs.items() if not job.inputs]


def _backend(spec: DagSpec, pub: PublishSpec) -> str | None:
    job = spec.jobs.get(pub.job)
    if job is None or pub.output_index >= len(job.outputs):
        return None  # reported above
    return job.outputs[pub.output_index].backend
