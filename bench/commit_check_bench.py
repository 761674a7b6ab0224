"""What checking output commits against the assigned version and prefix costs a completion.

Issue 38 made the Dispatcher compute each attempt's one acceptable location per scope and
refuse anything else. This times whole completions (claim + complete with N range commits and
their events) through the Dispatcher over a real Postgres (embedded, fsync on), interleaved
A/B in one run:

- checked: the Dispatcher as shipped (`commits.check_commits`);
- unchecked: the same with the version and location checks stubbed out (the pre-issue code).

Every completion's commits are counted in Postgres afterwards, and a forged one is refused;
the bench refuses to print figures when either check fails.

    python bench/commit_check_bench.py [--tasks 300] [--commits 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import smoke  # this folder's: run as a script
from embedded_pg import migrated_postgres  # this folder's: run as a script
from trace_platform import layout
from trace_platform.config import Settings
from trace_platform.contract import (
    ClaimRequest,
    CompleteRequest,
    DatasetRef,
    EventIn,
    OutputCommit,
    RangeSpec,
    TaskSpec,
)
from trace_platform.dispatcher import commits
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.errors import Forbidden
from trace_platform.identity import lite_admin
from trace_platform.services import Services

DAG = """
name: commit_bench
jobs:
  j:
    operator: noop
    outputs: [{backend: parquet}]
"""


def _world(svc: Services) -> tuple[DatasetRef, uuid.UUID]:
    """A deployed one-job DAG: its output as the Dispatcher assigns it, and the DAG."""
    with svc.pool.connection() as conn:
        me = lite_admin(conn)
    svc.control.deploy(me, DAG)
    with svc.pool.connection() as conn:
        row = conn.execute(
            "SELECT d.dag_id, v.dataset_uuid, v.dataset_version, v.location FROM dags d "
            "JOIN dataset_versions v ON v.dag_id = d.dag_id WHERE d.name = 'commit_bench'"
        ).fetchone()
    assert row is not None
    out = DatasetRef(
        dataset_uuid=row["dataset_uuid"],
        dataset_version=row["dataset_version"],
        backend="parquet",
        location=row["location"],
    )
    return out, row["dag_id"]


def _landed(svc: Services, out: DatasetRef) -> int:
    with svc.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM dataset_commits WHERE dataset_version = %s",
            [out.dataset_version],
        ).fetchone()
    return int(row["n"]) if row else -1


_NEXT = itertools.count()  # every range committed once in the whole run (no scope rewritten)


def _round(d: Dispatcher, out: DatasetRef, dag: uuid.UUID, tasks: int, n: int) -> float:
    """Seconds for `tasks` claim + complete, each committing `n` ranges of its own."""
    spec = TaskSpec(job="j", operator="noop", dag_id=dag, dag_version=1, outputs=[out])
    ids = [d.create_task(spec).task_id for _ in range(tasks)]
    assert out.location is not None
    t0 = time.perf_counter()
    for task_id in ids:
        c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
        ranges = [RangeSpec(start=a * 10, end=a * 10 + 10) for a in itertools.islice(_NEXT, n)]
        done = d.complete(
            CompleteRequest(
                task_id=task_id,
                attempt=c.attempt,
                lease_token=c.lease_token,
                outcome="succeeded",
                outputs=[
                    OutputCommit(
                        dataset_uuid=out.dataset_uuid,
                        range=r,
                        location=layout.scope_prefix(out.location, task_id, c.attempt, rng=r),
                    )
                    for r in ranges
                ],
                final_events=[EventIn(dataset_uuid=out.dataset_uuid, range=r) for r in ranges],
            )
        )
        if done.outputs_committed != n:
            raise SystemExit(f"completion committed {done.outputs_committed} of {n}: no figures")
    return time.perf_counter() - t0


def _checks_alone(out: DatasetRef, n: int, reps: int = 20_000) -> float:
    """Microseconds the checks of one completion take by themselves (no I/O): `n` commits and
    their events against a task row as the Dispatcher reads it."""
    task_id, attempt = uuid.uuid4(), 1
    assert out.location is not None
    st = {"task_id": task_id, "outputs": [out.model_dump(mode="json")]}
    ranges = [RangeSpec(start=a * 10, end=a * 10 + 10) for a in range(n)]
    outputs = [
        OutputCommit(
            dataset_uuid=out.dataset_uuid,
            range=r,
            location=layout.scope_prefix(out.location, task_id, attempt, rng=r),
        )
        for r in ranges
    ]
    events = [
        EventIn(dataset_uuid=out.dataset_uuid, range=r, payload={"location": c.location})
        for r, c in zip(ranges, outputs, strict=True)
    ]
    assigned = st["outputs"][0]
    t0 = time.perf_counter()
    for _ in range(reps):
        if len(commits.check_commits(st, attempt, outputs)) != n:
            raise SystemExit("the checks refused a commit of the task's own: no figures")
        for ev in events:
            commits.check_event_location(st, attempt, assigned, ev)
    return (time.perf_counter() - t0) / reps * 1e6


def _forged_is_refused(d: Dispatcher, out: DatasetRef, dag: uuid.UUID) -> bool:
    spec = TaskSpec(job="j", operator="noop", dag_id=dag, dag_version=1, outputs=[out])
    task_id = d.create_task(spec).task_id
    c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
    forged = OutputCommit(dataset_uuid=out.dataset_uuid, location=str(out.location))
    try:
        d.complete(
            CompleteRequest(
                task_id=task_id,
                attempt=c.attempt,
                lease_token=c.lease_token,
                outcome="succeeded",
                outputs=[forged],
            )
        )
    except Forbidden:
        return True
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--commits", type=int, default=4, help="range commits per completion")
    ap.add_argument("--rounds", type=int, default=5)
    args = smoke.parse_args(ap, tasks=10, commits=2, rounds=1)
    os.environ["TRACE_OPERATOR_REGISTRY"] = "testing"  # the no-op test operators
    with migrated_postgres("trace-commit-bench-") as (root, dsn):
        settings = Settings(state_dsn=dsn, home=root / "home", auth="permissive")
        svc = Services.build(settings, dsn)
        try:
            _bench(svc, args)
        finally:
            svc.close()


def _bench(svc: Services, args: argparse.Namespace) -> None:
    d = svc.dispatcher
    out, dag = _world(svc)
    if not _forged_is_refused(d, out, dag):
        raise SystemExit("a forged commit was accepted: no figures")
    unchecked: dict[str, Any] = {
        "assigned_version": lambda st, o, c: uuid.UUID(str(o["dataset_version"])),
        "check_location": lambda *a: None,
        "check_event_location": lambda *a: None,
    }
    samples: dict[str, list[float]] = {"checked": [], "unchecked": []}
    _round(d, out, dag, 50, args.commits)  # warm-up
    for _ in range(args.rounds):
        for side in ("checked", "unchecked"):  # interleaved: drift hits both alike
            if side == "unchecked":
                with mock.patch.multiple(commits, **unchecked):
                    secs = _round(d, out, dag, args.tasks, args.commits)
            else:
                secs = _round(d, out, dag, args.tasks, args.commits)
            samples[side].append(secs / args.tasks * 1e6)
    expected = (50 + 2 * args.rounds * args.tasks) * args.commits
    landed = _landed(svc, out)
    if landed != expected:
        raise SystemExit(f"{landed} commits landed, {expected} expected: no figures")
    a, b = statistics.median(samples["checked"]), statistics.median(samples["unchecked"])
    print(f"completions of {args.commits} range commits each, {args.tasks} per round, "
          f"{args.rounds} rounds interleaved (Postgres, fsync on)")  # fmt: skip
    print(f"  checked    median {a:8.1f} us/completion")
    print(f"  unchecked  median {b:8.1f} us/completion")
    alone = _checks_alone(out, args.commits)
    print(f"  the checks alone (CPU, no I/O): {alone:.1f} us/completion "
          f"({alone / b * 100:.2f}% of an unchecked completion)")  # fmt: skip
    print(f"  checks: +{a - b:.1f} us/completion ({(a / b - 1) * 100:+.1f}%), "
          f"{(a - b) / args.commits:.1f} us/commit")  # fmt: skip


if __name__ == "__main__":
    smoke.main(main)
