"""Whole-scope writers run one at a time.

A whole-input reader (WHOLE_OUTPUT_OPERATORS: sql_transform) reads every committed piece of its
inputs, as they stood when its attempt claimed and fetched, and rewrites its output as one
scope (`all`): the scope's last commit wins. Two runs of such a job at once could therefore
land the older read last, and the dataset would silently miss what only the newer read saw.

The Dispatcher never runs two attempts of such a job at once: a job without a worker pool gets
an implicit one-slot pool of its own (`whole:<job>`, a name no DAG's pool can take), and a
pooled one must keep `scaling.max_concurrency: 1` (refused at deploy otherwise). Claims are
then serialised by the pool slot machinery: the next run claims (and so reads) only after the
previous one released its slot, which its completion does in the transaction landing its
commit, so read order is commit order. An attempt that lost its slot (the reaper ended it) may
still report late; its success lands nothing (see Lifecycle._superseded_whole), since another
run may have read and landed since."""

from __future__ import annotations

from trace_platform.dag.schema import DagSpec, JobSpec
from trace_platform.operators import WHOLE_OUTPUT_OPERATORS

IMPLICIT_POOL_PREFIX = "whole:"


def writes_whole(job: JobSpec) -> bool:
    return job.operator in WHOLE_OUTPUT_OPERATORS and bool(job.outputs)


def implicit_pool(job_name: str) -> str:
    return f"{IMPLICIT_POOL_PREFIX}{job_name}"


def is_implicit_pool(pool: str | None) -> bool:
    return pool is not None and pool.startswith(IMPLICIT_POOL_PREFIX)


def task_pool(job_name: str, job: JobSpec) -> tuple[str | None, int | None]:
    """The worker pool and max_concurrency a task of the job runs with."""
    if job.worker_pool is not None:
        return job.worker_pool, job.scaling.max_concurrency
    if writes_whole(job):
        return implicit_pool(job_name), 1
    return None, None


def implicit_pools(spec: DagSpec) -> list[str]:
    """The one-slot pools of the spec's whole writers that name no pool of their own."""
    return [
        implicit_pool(name)
        for name, job in spec.jobs.items()
        if job.worker_pool is None and writes_whole(job)
    ]
