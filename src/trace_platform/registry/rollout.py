"""Safe change: a DAG version that changes what jobs produce is built beside the live one, then
cut over (or later rolled back) in one transaction that moves every affected `dataset_current`
pointer and the active dag_version together.

While a version builds, the live one keeps serving and processing; events for the jobs being
rebuilt are recorded as 'buffered' tasks of the new version (see `subscribers` in
dag_tasks.sql) and released at cutover. Each function runs inside the caller's transaction,
holding the DAG's lock exclusive (`lock`), so event fan-out sees any change whole.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.types.json import Jsonb

from trace_platform import faults
from trace_platform.contract import EventIn, RangeSpec
from trace_platform.dag.schema import DagSpec, JobOutputRef, SharedRead
from trace_platform.dispatcher.dag_tasks import event_json, fire_event, job_task
from trace_platform.dispatcher.intents import Intents
from trace_platform.dispatcher.slots import wake_in_place_of
from trace_platform.errors import Conflict
from trace_platform.store.dag_tasks import DagTaskStore
from trace_platform.store.registry import RegistryStore
from trace_platform.store.rollout import RolloutStore
from trace_platform.store.tasks import PoolKey

SCOPES_SHOWN = 20  # scopes listed per job in a plan; the count is always whole


@dataclass
class Replay:
    """What one job replays: the scopes (ranges, partitions, cursors, trigger firings) of the
    history its inputs hold."""

    job: str
    tasks: int = 0
    scopes: list[str] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)  # input (its name) -> scopes of it
    run_id: UUID | None = None  # the run the replayed tasks belong to (none on a dry run)

    def add(self, scope: str, source: str) -> None:
        self.tasks += 1
        self.sources[source] = self.sources.get(source, 0) + 1
        if len(self.scopes) < SCOPES_SHOWN:
            self.scopes.append(scope)


# What a backfill keeps of the history: (the input event as a task receives it, its scope).
ScopeFilter = Callable[[dict[str, Any], str], bool]


def lock(conn: Connection[Any], dag_id: UUID, *, shared: bool = False) -> dict[str, Any]:
    """The DAG's change lock, then its row, both held to the end of the transaction (`shared`:
    only the change lock, shared, as event fan-out takes it: for a plan that changes nothing)."""
    if shared:
        DagTaskStore(conn).lock_dag_shared(dag_id=dag_id)
        row = RegistryStore(conn).dag_by_id(dag_id=dag_id).fetchone()
        assert row is not None
        return row  # type: ignore[no-any-return]
    RolloutStore(conn).lock_dag(dag_id=dag_id)
    row = RolloutStore(conn).dag_for_update(dag_id=dag_id).fetchone()
    assert row is not None
    return row  # type: ignore[no-any-return]


def version_map(conn: Connection[Any], dag_id: UUID, version: int) -> dict[UUID, UUID]:
    """dataset -> the dataset version this DAG version writes."""
    rows = RolloutStore(conn).version_outputs(dag_id=dag_id, version=version).fetchall()
    return {r["dataset_uuid"]: r["dataset_version"] for r in rows}


def lineage(conn: Connection[Any], dag_id: UUID, version: int) -> dict[str, int]:
    """job -> the DAG version whose deploy cut its outputs."""
    rows = RolloutStore(conn).version_jobs(dag_id=dag_id, version=version).fetchall()
    return {r["job"]: r["since_version"] for r in rows}


# -- replays -------------------------------------------------------------------------------
def replay(
    conn: Connection[Any],
    intents: Intents,
    *,
    dag: dict[str, Any],
    version: int,
    spec: DagSpec,
    jobs: Iterable[str],
    kind: str,
    fired_by: UUID | None,
    status: str = "queued",
    check_consumed: bool = False,
    invalidates: bool = False,
    dry_run: bool = False,
    only_inputs: set[UUID] | None = None,
    keep: ScopeFilter | None = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Replay]:
    """Tasks of `version` for `jobs` over the history their inputs hold: for each triggering
    input that is not itself rebuilt here, the events of its current version (the newest per
    scope); for a source job, the trigger firings. Inputs rebuilt here feed the rebuild
    downstream as it runs. With `check_consumed`, history a task writing the same outputs
    already consumed is skipped (a rollback catches up only on what it missed). With
    `invalidates`, each replayed event reaches its task as an invalidation (what the job built
    from it before is stale). `keep` narrows the history (a backfill's scopes). A `dry_run`
    counts and creates nothing. The replayed tasks are one run (`Replay.run_id`), recorded
    only when there is something to replay."""
    jobs = set(jobs)
    dag_id: UUID = dag["dag_id"]
    vmap = version_map(conn, dag_id, version)
    current = _current(conn, list(vmap))
    rebuilt = {ds for ds, ver in vmap.items() if current.get(ds) != ver}
    run_id = uuid.uuid4()
    recorded = False
    plans: dict[str, Replay] = {}
    outputs = RolloutStore(conn).version_outputs(dag_id=dag_id, version=version).fetchall()
    for name in sorted(jobs):
        plan = plans[name] = Replay(name)
        target = [
            {"dataset_version": str(o["dataset_version"])} for o in outputs if o["job"] == name
        ]
        for input_event, event_id, scope, source in _history(
            conn, dag, spec, name, current, rebuilt, Jsonb(target), check_consumed, only_inputs
        ):
            if keep is not None and not keep(input_event, scope):
                continue
            plan.add(scope, source)
            if dry_run:
                continue
            if not recorded:
                RolloutStore(conn).insert_change_run(
                    run_id=run_id,
                    dag_id=dag_id,
                    dag_version=version,
                    kind=kind,
                    fire_key=f"{kind}:v{version}:{run_id}",
                    config=Jsonb({"jobs": sorted(jobs), **(config or {})}),
                    fired_by=fired_by,
                )
                recorded = True
            plan.run_id = run_id
            if invalidates:
                input_event["invalidates"] = True
            _replay_task(
                conn, intents, dag, version, name, spec, run_id, input_event, event_id, status
            )
    return plans


def _history(
    conn: Connection[Any],
    dag: dict[str, Any],
    spec: DagSpec,
    name: str,
    current: dict[UUID, UUID],
    rebuilt: set[UUID],
    target: Jsonb,
    check_consumed: bool,
    only_inputs: set[UUID] | None = None,
) -> list[tuple[dict[str, Any], UUID | None, str, str]]:
    """(input event, its id, its scope, the input it came from) for every piece of history job
    `name` replays (from `only_inputs`, when given)."""
    common = {
        "dag_id": dag["dag_id"],
        "job": name,
        "target": target,
        "check_consumed": check_consumed,
        "versions": _sharing(conn, dag, name) if check_consumed else [],
    }
    job = spec.jobs[name]
    if not job.inputs:
        return [
            (
                fire_event(f["trigger"], f["kind"], f["fire_key"], f["config"]),
                None,
                f"{f['kind']}:{f['trigger']}:{f['fire_key']}",
                "triggers",
            )
            for f in RolloutStore(conn).replay_fires(**common).fetchall()
        ]
    out: list[tuple[dict[str, Any], UUID | None, str, str]] = []
    for inp in job.inputs:
        if not inp.triggers:
            continue
        ds = _input_dataset(conn, dag, inp)
        if ds is None or ds in rebuilt or (only_inputs is not None and ds not in only_inputs):
            continue  # rebuilt here: its new events reach this job as the rebuild runs
        written = current.get(ds) or _current(conn, [ds]).get(ds)
        if written is None:
            continue
        params = {
            **common,
            "dataset_uuid": ds,
            "written": Jsonb([{"dataset_version": str(written)}]),
        }
        for e in RolloutStore(conn).replay_events(**params).fetchall():
            ev = EventIn(
                dataset_uuid=e["dataset_uuid"],
                cursor=e["cursor"],
                partition_key=e["partition_key"],
                range=RangeSpec(start=e["range_start"], end=e["range_end"])
                if e["range_start"] is not None
                else None,
                payload=e["payload"],
            )
            out.append(
                (
                    event_json(e["event_id"], e["producer_task_id"], ev),
                    e["event_id"],
                    ev.dedupe_key,
                    _input_label(inp),
                )
            )
    return out


def _input_label(inp: Any) -> str:
    """How a plan names an input: its published name, or the job output it is."""
    if isinstance(inp, SharedRead):
        return inp.from_.dataset
    return f"{inp.job}.outputs[{inp.output}]"


def _replay_task(
    conn: Connection[Any],
    intents: Intents,
    dag: dict[str, Any],
    version: int,
    name: str,
    spec: DagSpec,
    run_id: UUID,
    input_event: dict[str, Any],
    event_id: UUID | None,
    status: str,
) -> None:
    task = job_task(
        conn,
        org_id=dag["org_id"],
        dag_id=dag["dag_id"],
        version=version,
        job_name=name,
        job=spec.jobs[name],
        run_id=run_id,
        input_event_id=event_id,
        input_event=input_event,
    )
    intents.create_task(task, conn, status)


def _sharing(conn: Connection[Any], dag: dict[str, Any], job: str) -> list[int]:
    """The DAG versions in which `job` has its lineage in the DAG's active version."""
    since = lineage(conn, dag["dag_id"], dag["active_version"]).get(job)
    if since is None:
        return []
    rows = (
        RolloutStore(conn).lineage_versions(dag_id=dag["dag_id"], job=job, since=since).fetchall()
    )
    return [r["dag_version"] for r in rows]


def _current(conn: Connection[Any], datasets: list[UUID]) -> dict[UUID, UUID]:
    rows = RolloutStore(conn).current_of(datasets=datasets).fetchall()
    return {r["dataset_uuid"]: r["dataset_version"] for r in rows}


def _input_dataset(conn: Connection[Any], dag: dict[str, Any], inp: Any) -> UUID | None:
    if isinstance(inp, JobOutputRef):
        key = {"dag_id": dag["dag_id"], "job": inp.job, "idx": inp.output}
        row = RegistryStore(conn).dataset_by_producer(**key).fetchone()
    else:
        assert isinstance(inp, SharedRead)
        key = {"org_id": dag["org_id"], "name": inp.from_.dataset}
        row = RegistryStore(conn).dataset_by_name(**key).fetchone()
    return row["dataset_uuid"] if row else None


# -- progress, cutover, rollback -----------------------------------------------------------
def progress(conn: Connection[Any], dag_id: UUID, version: int) -> list[dict[str, Any]]:
    """Per job of `version`: its tasks, how many succeeded, wait, are held, failed."""
    return RolloutStore(conn).progress(dag_id=dag_id, version=version).fetchall()


def blockers(rows: list[dict[str, Any]]) -> str | None:
    """Why a building version cannot cut over yet (None: it can)."""
    pending = sum(r["pending"] for r in rows)
    failed = [f"{r['job']} ({r['failed']})" for r in rows if r["failed"]]
    canceled = [f"{r['job']} ({r['canceled']})" for r in rows if r["canceled"]]
    if failed or canceled:
        # Either leaves a hole in what the rebuild holds: going live would serve it.
        what = "; ".join(
            f"rebuild tasks {verb}: {', '.join(jobs)}"
            for verb, jobs in (("failed", failed), ("canceled", canceled))
            if jobs
        )
        return f"{what}; fix and deploy again, or abandon the rebuild with `trace dag rollback`"
    if pending:
        return f"{pending} rebuild task{'s' if pending != 1 else ''} still queued or running"
    return None


def cutover(
    conn: Connection[Any],
    intents: Intents,
    dag_id: UUID,
    *,
    spec_of: Callable[[UUID, int], DagSpec],
    expect: int | None = None,
) -> dict[str, Any]:
    """Makes the building version live: every pointer of its map, the active version, its held
    work released and the replaced version's outstanding work on rebuilt jobs canceled, all
    in the caller's one transaction. Refused while any rebuild task waits or failed."""
    dag = lock(conn, dag_id)
    version = dag["building_version"]
    if version is None or (expect is not None and version != expect):
        raise Conflict(
            "no_rebuild",
            f"DAG '{dag['name']}' has no rebuild in flight"
            + (f" for version {expect}" if expect is not None else ""),
        )
    why = blockers(progress(conn, dag_id, version))
    if why is not None:
        raise Conflict("rebuild_incomplete", f"version {version} cannot cut over yet: {why}")
    previous = dag["active_version"]
    rebuilt = [j for j, since in lineage(conn, dag_id, version).items() if since == version]
    key = {"dag_id": dag_id, "version": version}
    RolloutStore(conn).complete_versions(**key)
    swapped = RolloutStore(conn).point_current(**key).fetchall()
    faults.point("rollout.cutover_after_swap")  # chaos: die with pointers half-written
    RolloutStore(conn).make_active(**key)
    if previous is not None:
        RolloutStore(conn).set_version_state(dag_id=dag_id, version=previous, state="retired")
    RolloutStore(conn).set_version_state(**key, state="active")
    canceled = _cancel_work(
        conn,
        intents,
        dag_id=dag_id,
        versions=[v for v in _live_versions(conn, dag_id) if v != version],
        jobs=rebuilt,
        reason=f"superseded by version {version} at cutover",
    )
    released = _release(conn, intents, dag_id, version)
    readers = refresh_readers(conn, intents, dag_id, [r["dataset_uuid"] for r in swapped], spec_of)
    return {
        "dag": dag["name"],
        "version": version,
        "previous": previous,
        "datasets_swapped": len(swapped),
        "released": released,
        "canceled": len(canceled),
        "readers": readers,
    }


def refresh_readers(
    conn: Connection[Any],
    intents: Intents,
    dag_id: UUID,
    datasets: list[UUID],
    spec_of: Callable[[UUID, int], DagSpec],
) -> dict[str, int]:
    """Other DAGs reading swapped datasets built from what was current before: each reading
    job re-runs over the new version's history, as invalidations (so its downstream follows),
    in a run of its own DAG. Returns tasks made per reading DAG."""
    if not datasets:
        return {}
    out: dict[str, int] = {}
    for r in RolloutStore(conn).shared_readers(dag_id=dag_id, datasets=datasets).fetchall():
        DagTaskStore(conn).lock_dag_shared(dag_id=r["dag_id"])
        reader = RegistryStore(conn).dag_by_id(dag_id=r["dag_id"]).fetchone()
        assert reader is not None
        plans = replay(
            conn,
            intents,
            dag=reader,
            version=reader["active_version"],
            spec=spec_of(r["dag_id"], reader["active_version"]),
            jobs=r["jobs"],
            kind="upstream",
            fired_by=None,
            invalidates=True,
            only_inputs=set(datasets),
        )
        out[reader["name"]] = sum(p.tasks for p in plans.values())
    return out


def _release(conn: Connection[Any], intents: Intents, dag_id: UUID, version: int) -> int:
    rows = RolloutStore(conn).release_buffered(dag_id=dag_id, version=version).fetchall()
    for r in rows:
        intents.wake(conn, r["task_id"])
    return len(rows)


def _live_versions(conn: Connection[Any], dag_id: UUID) -> list[int]:
    rows = RolloutStore(conn).dag_versions(dag_id=dag_id).fetchall()
    return [r["version"] for r in rows]


def _cancel_work(
    conn: Connection[Any],
    intents: Intents,
    *,
    dag_id: UUID,
    versions: list[int],
    jobs: list[str] | None,
    reason: str,
) -> list[dict[str, Any]]:
    """`RolloutStore.cancel_work`, and the tasks that can take the place of the pooled ones it
    canceled while they waited (one may have been the task a release woke) woken."""
    rows = (
        RolloutStore(conn)
        .cancel_work(dag_id=dag_id, versions=versions, jobs=jobs, reason=reason)
        .fetchall()
    )
    waited = [
        (PoolKey(dag_id=r["pool_dag_id"], pool=r["worker_pool"]), r["whole_job"])
        for r in rows
        if r["status"] == "canceled" and r["worker_pool"] is not None
    ]
    wake_in_place_of(conn, intents, waited)
    return rows


def abandon(
    conn: Connection[Any], intents: Intents, dag: dict[str, Any], reason: str
) -> int | None:
    """Drops a rebuild in flight: its versions abandoned, its work canceled (a running attempt
    is asked to stop, and lands nothing if it finishes anyway)."""
    version = dag["building_version"]
    if version is None:
        return None
    key = {"dag_id": dag["dag_id"], "version": version}
    RolloutStore(conn).abandon_versions(**key)
    RolloutStore(conn).set_version_state(**key, state="abandoned")
    RolloutStore(conn).set_building(dag_id=dag["dag_id"], version=None)
    _cancel_work(conn, intents, dag_id=dag["dag_id"], versions=[version], jobs=None, reason=reason)
    dag["building_version"] = None
    return int(version)


def rollback(
    conn: Connection[Any],
    intents: Intents,
    dag_id: UUID,
    *,
    to: int | None,
    spec_of: Callable[[UUID, int], DagSpec],
    fired_by: UUID | None,
) -> dict[str, Any]:
    """Puts `to` (default: the version active before this one) back live in one transaction:
    pointers and active version swapped back, the rolled-back version's queued and held work
    canceled and its running attempts asked to stop (whatever they report lands nothing), a
    rebuild in flight abandoned. Work the restored version missed while it was not live is
    replayed for it. `spec_of(dag_id, version)` gives a version's DagSpec."""
    dag = lock(conn, dag_id)
    active = dag["active_version"]
    abandoned = abandon(conn, intents, dag, "rolled back")
    if to is None:
        if abandoned is not None:
            return {
                "dag": dag["name"],
                "version": active,
                "rolled_back": None,
                "abandoned": abandoned,
                "replays": {},
            }
        to = _previous_active(conn, dag_id, active)
    if to == active:
        raise Conflict("already_active", f"version {to} of DAG '{dag['name']}' is already active")
    states = {r["version"]: r for r in RolloutStore(conn).dag_versions(dag_id=dag_id)}
    if to not in states:
        raise Conflict("unknown_version", f"DAG '{dag['name']}' has no version {to}")
    if states[to]["state"] == "abandoned":
        raise Conflict("abandoned", f"version {to} of DAG '{dag['name']}' was never completed")
    outs = RolloutStore(conn).version_outputs(dag_id=dag_id, version=to).fetchall()
    spec = spec_of(dag_id, to)
    wanted = sum(len(j.outputs) for j in spec.jobs.values())
    if len(outs) < wanted or any(o["state"] != "complete" for o in outs):
        raise Conflict(
            "not_restorable",
            f"version {to} of DAG '{dag['name']}' cannot be restored: some of its dataset "
            "versions were purged or never completed",
        )
    key = {"dag_id": dag_id, "version": to}
    swapped = RolloutStore(conn).point_current(**key).fetchall()
    RolloutStore(conn).make_active(**key)
    RolloutStore(conn).set_version_state(dag_id=dag_id, version=active, state="rolled_back")
    RolloutStore(conn).set_version_state(**key, state="active")
    # Only the jobs the two versions do not share: the others' work is the same in both, it
    # goes on (and lands) whichever version made it.
    before, after = lineage(conn, dag_id, active), lineage(conn, dag_id, to)
    jobs = {j for j, since in after.items() if before.get(j) != since}
    canceled = _cancel_work(
        conn,
        intents,
        dag_id=dag_id,
        versions=[active],
        jobs=sorted(j for j, since in before.items() if after.get(j) != since),
        reason="rolled back",
    )
    # Jobs whose outputs differ missed what came while `to` was not live: each catches up on
    # it (what it already consumed is skipped).
    plans = replay(
        conn,
        intents,
        dag={**dag, "active_version": to},
        version=to,
        spec=spec,
        jobs=jobs,
        kind="rollback",
        fired_by=fired_by,
        check_consumed=True,
    )
    readers = refresh_readers(conn, intents, dag_id, [r["dataset_uuid"] for r in swapped], spec_of)
    return {
        "dag": dag["name"],
        "version": to,
        "rolled_back": active,
        "abandoned": abandoned,
        "datasets_swapped": len(swapped),
        "canceled": len(canceled),
        "replays": {j: p.tasks for j, p in plans.items() if p.tasks},
        "readers": readers,
    }


def _previous_active(conn: Connection[Any], dag_id: UUID, active: int) -> int:
    rows = RolloutStore(conn).dag_versions(dag_id=dag_id).fetchall()
    for r in rows:  # newest first
        if r["version"] < active and r["activated_at"] is not None and r["state"] == "retired":
            return int(r["version"])
    raise Conflict("no_previous", f"version {active} has no earlier live version to roll back to")


def set_paused(
    conn: Connection[Any], intents: Intents, dag_id: UUID, paused: bool
) -> dict[str, Any]:
    """Pause: the DAG's tasks are still created (nothing is lost) but none is claimed; running
    attempts finish. Resume wakes every waiting task."""
    dag = lock(conn, dag_id)
    RolloutStore(conn).set_paused(dag_id=dag_id, paused=paused)
    woken = 0
    if not paused and dag["paused"]:
        for r in RolloutStore(conn).queued_of_dag(dag_id=dag_id).fetchall():
            intents.wake(conn, r["task_id"])
            woken += 1
    return {"dag": dag["name"], "paused": paused, "woken": woken}
