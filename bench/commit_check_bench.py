"""What checking output commits against the assigned version and prefix costs a completion.

Issue 38 made the Dispatcher compute each attempt's one acceptable location per scope and
refuse anything else. This times whole completions (claim + complete with N range commits and
their events) through the Dispatcher over the in-memory store, interleaved A/B in one run:

- checked: the Dispatcher as shipped (`commits.check_commits`);
- unchecked: the same with the version and location checks stubbed out (the pre-issue code).

The in-memory store has no network or fsync, so a completion costs tens of microseconds and the
checks' share is as large here as it can be anywhere: against Postgres (about a millisecond a
completion, see bench/dispatch_bench.py) it is smaller still. Every completion's commits are
counted in the store afterwards, and a forged one is refused on every run; the bench refuses to
print figures when either check fails.

    python bench/commit_check_bench.py [--tasks 2000] [--commits 4] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trace_platform import layout
from trace_platform.config import Settings
from trace_platform.contract import (
    LITE_ORG_ID,
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
from trace_platform.store.tasks.memory import MemoryStore


def _world(tmp: Path) -> tuple[Dispatcher, MemoryStore, DatasetRef, uuid.UUID]:
    store = MemoryStore()
    settings = Settings(state_dsn="postgresql://unused/never", auth="permissive", home=tmp)
    d = Dispatcher(store, settings)
    dag = uuid.uuid4()
    store.add_dag(dag, "bench")
    ds, version = uuid.uuid4(), uuid.uuid4()
    store.add_dataset_version(ds, version, "replace", None, org_id=LITE_ORG_ID)
    where = layout.version_location(LITE_ORG_ID, ds, version, "parquet")
    out = DatasetRef(dataset_uuid=ds, dataset_version=version, backend="parquet", location=where)
    return d, store, out, dag


def _round(d: Dispatcher, out: DatasetRef, dag: uuid.UUID, tasks: int, n: int) -> float:
    """Seconds for `tasks` claim + complete, each committing `n` ranges of its own."""
    spec = TaskSpec(job="j", operator="noop", dag_id=dag, dag_version=1, outputs=[out])
    ids = [d.create_task(spec).task_id for _ in range(tasks)]
    assert out.location is not None
    t0 = time.perf_counter()
    for i, task_id in enumerate(ids):
        c = d.claim(ClaimRequest(task_id=task_id, worker_id="w"))
        ranges = [RangeSpec(start=(i * n + k) * 10, end=(i * n + k + 1) * 10) for k in range(n)]
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
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--commits", type=int, default=4, help="range commits per completion")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="commit-bench-"))
    d, store, out, dag = _world(tmp)
    if not _forged_is_refused(d, out, dag):
        raise SystemExit("a forged commit was accepted: no figures")
    unchecked: dict[str, Any] = {
        "assigned_version": lambda st, o, c: uuid.UUID(str(o["dataset_version"])),
        "check_location": lambda *a: None,
        "check_event_location": lambda *a: None,
    }
    samples: dict[str, list[float]] = {"checked": [], "unchecked": []}
    _round(d, out, dag, 200, args.commits)  # warm-up
    for _ in range(args.rounds):
        for side in ("checked", "unchecked"):  # interleaved: drift hits both alike
            if side == "unchecked":
                with mock.patch.multiple(commits, **unchecked):
                    secs = _round(d, out, dag, args.tasks, args.commits)
            else:
                secs = _round(d, out, dag, args.tasks, args.commits)
            samples[side].append(secs / args.tasks * 1e6)
    expected = (200 + 2 * args.rounds * args.tasks) * args.commits
    landed = len(store.rows("dataset_commits"))
    if landed != expected:
        raise SystemExit(f"{landed} commits landed, {expected} expected: no figures")
    a, b = statistics.median(samples["checked"]), statistics.median(samples["unchecked"])
    print(f"completions of {args.commits} range commits each, {args.tasks} per round, "
          f"{args.rounds} rounds interleaved (in-memory store)")  # fmt: skip
    print(f"  checked    median {a:8.1f} us/completion")
    print(f"  unchecked  median {b:8.1f} us/completion")
    print(f"  checks: +{a - b:.1f} us/completion ({(a / b - 1) * 100:+.1f}%), "
          f"{(a - b) / args.commits:.1f} us/commit")  # fmt: skip


if __name__ == "__main__":
    main()
