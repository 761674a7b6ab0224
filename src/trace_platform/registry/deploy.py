"""Deploy: one transaction that stores an immutable dag_version, registers every job output as
a dataset, maps every output to the dataset version this DAG version writes, wires
subscriptions and pool slots, and then either goes live at once (nothing it changes alters
what a job produces) or starts a rebuild: new 'building' dataset versions for the changed jobs
and everything downstream of them, and replays of the history they need, while the live
version keeps serving (`rollout.py` cuts over when the rebuild is complete). Any problem rolls
all of it back: nothing is ever half-deployed."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.types.json import Jsonb

from trace_platform import faults
from trace_platform.alerts import datasets as alert_datasets
from trace_platform.dag.schema import DagSpec, JobOutputRef, JobSpec, PoolSlot, SharedRead
from trace_platform.dag.validate import DagInvalid, DagProblem
from trace_platform.dag.whole import implicit_pools
from trace_platform.dispatcher.intents import Intents
from trace_platform.errors import Conflict
from trace_platform.identity import Actor, Forbidden, can_deploy, can_read
from trace_platform.identity.vault import can_use_secret
from trace_platform.layout import dataset_location, version_location
from trace_platform.registry import buffered, names, rollout
from trace_platform.registry.reserved import PLATFORM_DAG
from trace_platform.store.registry import RegistryStore
from trace_platform.store.rollout import RolloutStore
from trace_platform.store.secrets import SecretStore


@dataclass
class JobChange:
    """How one job differs from the live version: added, removed or modified, and whether the
    change alters what it produces (then it and its downstream are rebuilt)."""

    job: str
    change: str  # 'added' | 'removed' | 'modified'
    affects_materialization: bool
    fields: list[str] = field(default_factory=list)


@dataclass
class DeployResult:
    dag_id: UUID
    name: str
    version: int
    created: bool
    rebuilt_jobs: list[str] = field(default_factory=list)
    datasets: dict[str, UUID] = field(default_factory=dict)  # published name -> uuid
    changes: list[JobChange] = field(default_factory=list)
    live: bool = True  # False: building; the active version serves until cutover
    manual_cutover: bool = False
    active_version: int | None = None  # the version serving after this deploy
    abandoned: int | None = None  # a rebuild in flight this deploy superseded
    replays: dict[str, rollout.Replay] = field(default_factory=dict)


def _downstream(spec: DagSpec, changed: set[str]) -> set[str]:
    """The changed jobs plus everything that depends on them, transitively (one walk over the
    reverse edges: linear in the DAG's size)."""
    readers: dict[str, list[str]] = {}
    for name, job in spec.jobs.items():
        for i in job.inputs:
            if isinstance(i, JobOutputRef):
                readers.setdefault(i.job, []).append(name)
    out = set(changed)
    todo = list(changed)
    while todo:
        for reader in readers.get(todo.pop(), []):
            if reader not in out:
                out.add(reader)
                todo.append(reader)
    return out


@dataclass
class _Deploy:
    """What one deploy's steps share: the caller's connection and transaction, who deploys
    what, and what the steps before have decided."""

    conn: Connection[Any]
    actor: Actor | None  # None: a change not made by a user (an automatic cutover)
    spec: DagSpec
    source_yaml: str
    source: str
    dag: dict[str, Any]
    created: bool
    previous: dict[str, Any]  # the active version's jobs, as stored ({} on a first deploy)
    version: int = 0
    rebuild: set[str] = field(default_factory=set)
    changes: list[JobChange] = field(default_factory=list)
    abandoned: int | None = None

    @property
    def deployer(self) -> Actor:
        assert self.actor is not None, "only a deploy has a deployer"
        return self.actor

    @property
    def org_id(self) -> UUID:
        org_id: UUID = self.dag["org_id"]
        return org_id

    @property
    def dag_id(self) -> UUID:
        dag_id: UUID = self.dag["dag_id"]
        return dag_id

    @property
    def building(self) -> bool:
        """A change to what existing jobs produce: built beside the live version."""
        return bool(self.previous) and bool(self.rebuild)

    outputs: dict[tuple[str, int], UUID] = field(default_factory=dict)  # (job, idx) -> dataset
    published: dict[str, UUID] = field(default_factory=dict)
    problems: list[DagProblem] = field(default_factory=list)


def deploy(
    conn: Connection[Any],
    actor: Actor,
    spec: DagSpec,
    source_yaml: str,
    source: str,
    *,
    intents: Intents,
    manual_cutover: bool = False,
    dry_run: bool = False,
) -> DeployResult:
    """Run inside the caller's transaction; raises DagInvalid/Forbidden to roll it all back.
    `spec` is what `parse(source_yaml)` returned: every file-local check (the size caps
    included) has passed before a transaction is opened."""
    d = _lock_dag(conn, actor, spec, source_yaml, source, dry_run)
    _supersede_rebuild(d, intents)
    _store_version(d)
    _plan_rebuild(d)
    _assign_datasets(d, shape=not d.building)
    d.problems += buffered.register(
        d.conn,
        d.actor,
        spec,
        org_id=d.org_id,
        dag_id=d.dag_id,
        version=d.version,
        max_batch_bytes=intents.settings.sink_max_batch_bytes,
    )
    d.problems += alert_datasets.register(
        d.conn, spec, org_id=d.org_id, dag_id=d.dag_id, version=d.version
    )
    d.problems += buffered.check_writers(d.conn, spec, d.org_id)
    _cut_versions(d)
    _publish_names(d, apply=not d.building)
    _wire_subscriptions(d)
    _pool_slots(d, retire=not d.building)
    _check_secrets(d)
    _init_cron(d)
    if d.problems:  # every step has run: all problems are reported at once
        raise DagInvalid(d.source, d.problems)
    build = d.building
    if build:
        replays = _start_rebuild(d, intents, manual_cutover, dry_run)
    else:
        _go_live(d)
        replays = _replay_new_jobs(d, intents, dry_run)
    faults.point("deploy.before_commit")  # chaos: die with the whole deploy written, uncommitted
    return DeployResult(
        d.dag_id,
        spec.name,
        d.version,
        d.created,
        sorted(d.rebuild) if d.previous else [],
        d.published,
        changes=d.changes,
        live=not d.building,
        manual_cutover=manual_cutover and d.building,
        active_version=d.version if not d.building else d.dag["active_version"],
        abandoned=d.abandoned,
        replays=replays,
    )


def _lock_dag(
    conn: Connection[Any],
    actor: Actor,
    spec: DagSpec,
    source_yaml: str,
    source: str,
    dry_run: bool,
) -> _Deploy:
    """The DAG row (made on a first deploy), locked, once the actor may deploy it. A dry run
    holds the change lock shared: events keep flowing while it plans."""
    created = (
        RegistryStore(conn)
        .insert_dag(dag_id=uuid.uuid4(), org_id=actor.org_id, name=spec.name, owner=actor.user_id)
        .rowcount
        == 1
    )
    # Not locked yet: the change lock comes first, then the row (every change takes them in
    # that order; a row locked first would deadlock with a cutover).
    dag = RegistryStore(conn).dag_by_name(org_id=actor.org_id, name=spec.name).fetchone()
    assert dag is not None
    if spec.name == PLATFORM_DAG:
        _platform_dag(conn, actor, dag, dry_run)
    if not can_deploy(actor, dag):
        raise Forbidden(
            f"'{actor.name}' may not deploy DAG '{spec.name}' (not its owner, an admin, or in its deploy roles)"
        )
    dag = rollout.lock(conn, dag["dag_id"], shared=dry_run)
    previous: dict[str, Any] = {}
    if dag["active_version"] is not None:
        prev = (
            RegistryStore(conn)
            .dag_version(dag_id=dag["dag_id"], version=dag["active_version"])
            .fetchone()
        )
        previous = prev["spec"]["jobs"] if prev else {}
    return _Deploy(conn, actor, spec, source_yaml, source, dag, created, previous)


def _platform_dag(conn: Connection[Any], actor: Actor, dag: dict[str, Any], dry_run: bool) -> None:
    """The platform's own readers (saved queries, `trace verify`) trust what PLATFORM_DAG
    publishes, so only org admins deploy it, and an admin's deploy makes it an admin's: a
    user who created the name first (before this rule, or by any other path) keeps no hold on
    it (no trigger, backfill, pause or rollback of it)."""
    if not actor.is_admin:
        raise Forbidden(
            f"'{actor.name}' may not deploy DAG '{PLATFORM_DAG}': it is the platform's DAG, "
            "whose datasets the saved queries and `trace verify` trust; only an org admin may"
        )
    if dag["owner_user_id"] != actor.user_id and not dry_run:
        RegistryStore(conn).take_dag_ownership(dag_id=dag["dag_id"], owner=actor.user_id)
        dag["owner_user_id"], dag["deploy_roles"] = actor.user_id, []


def _supersede_rebuild(d: _Deploy, intents: Intents) -> None:
    """A rebuild still in flight is abandoned: this deploy is compared with the live version,
    and replays whatever that rebuild would have."""
    d.abandoned = rollout.abandon(d.conn, intents, d.dag, "superseded by a newer deploy")


def _store_version(d: _Deploy) -> None:
    """The immutable dag_version: the spec as deployed, its source and checksum."""
    d.version = RegistryStore(d.conn).next_version(dag_id=d.dag_id).fetchone()["v"]  # type: ignore[index]
    RegistryStore(d.conn).insert_dag_version(
        dag_id=d.dag_id,
        version=d.version,
        spec=Jsonb(d.spec.model_dump(mode="json", by_alias=True)),
        source_yaml=d.source_yaml,
        checksum=hashlib.sha256(d.source_yaml.encode()).hexdigest(),
        deployed_by=d.deployer.user_id,
    )


def _plan_rebuild(d: _Deploy) -> None:
    d.changes, d.rebuild = plan_changes(d.spec, d.previous)


def plan_changes(spec: DagSpec, previous: dict[str, Any]) -> tuple[list[JobChange], set[str]]:
    """How each job differs from the live version's (`previous`: its jobs as stored), and which
    jobs produce different data now: the ones whose materialization changed (or that are new)
    and all their downstream."""
    changes: list[JobChange] = []
    for name, job in spec.jobs.items():
        if name not in previous:
            changes.append(JobChange(name, "added", True))
            continue
        before = JobSpec.model_validate(previous[name])
        fields = [f for f in JobSpec.model_fields if getattr(before, f) != getattr(job, f)]
        if fields:
            affects = before.materialization() != job.materialization()
            changes.append(JobChange(name, "modified", affects, fields))
    for name in sorted(previous.keys() - spec.jobs.keys()):
        changes.append(JobChange(name, "removed", False))
    return changes, _downstream(spec, {c.job for c in changes if c.affects_materialization})


def _assign_datasets(d: _Deploy, *, shape: bool = True) -> None:
    """Every output is a dataset with a stable identity, kept across versions of the DAG. Its
    shape (backend, update strategy) changes only when a version that has it goes live."""
    known = {
        (r["producer_job"], r["producer_output_index"]): r
        for r in RegistryStore(d.conn).datasets_of_dag(dag_id=d.dag_id).fetchall()
    }
    for name, job in d.spec.jobs.items():
        for idx, out in enumerate(job.outputs):
            row = known.get((name, idx))
            ds_uuid: UUID = row["dataset_uuid"] if row else uuid.uuid4()
            fields = {
                "dataset_uuid": ds_uuid,
                "backend": out.backend,
                "location": dataset_location(d.org_id, ds_uuid, out.backend),
                "update_strategy": out.update_strategy,
                "unique_key": out.unique_key,
            }
            if row is None:
                RegistryStore(d.conn).insert_dataset(
                    **fields, org_id=d.org_id, dag_id=d.dag_id, job=name, idx=idx
                )
            elif shape and any(row[k] != v for k, v in fields.items()):
                RegistryStore(d.conn).update_dataset_shape(**fields)
            d.outputs[(name, idx)] = ds_uuid


def _cut_versions(d: _Deploy) -> None:
    """The version's map: a rebuilt job's outputs (and any without a version yet) get a new,
    empty dataset version ('building' while the live version serves); the others keep writing
    the live version's. Each job records the version that cut its outputs (its lineage)."""
    live = d.dag["active_version"]
    live_map = rollout.version_map(d.conn, d.dag_id, live) if live is not None else {}
    live_lineage = rollout.lineage(d.conn, d.dag_id, live) if live is not None else {}
    for name, job in d.spec.jobs.items():
        cut = name in d.rebuild or not d.previous
        for idx, out in enumerate(job.outputs):
            ds_uuid = d.outputs[(name, idx)]
            ver = live_map.get(ds_uuid)
            if cut or ver is None:
                cut = True
                ver = uuid.uuid4()
                RolloutStore(d.conn).insert_dataset_version(
                    dataset_version=ver,
                    dataset_uuid=ds_uuid,
                    dag_id=d.dag_id,
                    dag_version=d.version,
                    location=version_location(d.org_id, ds_uuid, ver, out.backend),
                    state="building" if d.building else "complete",
                    backend=out.backend,
                    update_strategy=out.update_strategy,
                    unique_key=out.unique_key,
                )
            RolloutStore(d.conn).insert_version_output(
                dag_id=d.dag_id,
                version=d.version,
                job=name,
                dataset_uuid=ds_uuid,
                dataset_version=ver,
            )
        RolloutStore(d.conn).insert_version_job(
            dag_id=d.dag_id,
            version=d.version,
            job=name,
            since_version=d.version if cut else live_lineage.get(name, 0),
        )


def _publish_names(d: _Deploy, *, apply: bool = True) -> None:
    """Publishing is metadata only: names move, data does not. A building version's names
    are checked now and move at its cutover. A user's deploy may publish only the names its
    deployer may (registry/names.py); a cutover or rollback skips the names an admin reclaimed
    from this DAG."""
    held = {
        r["dataset_name"]
        for r in RegistryStore(d.conn).datasets_of_dag(dag_id=d.dag_id).fetchall()
        if r["dataset_name"] is not None
    }
    reclaimed = names.reclaimed_from(d.conn, d.dag_id) if d.actor is None else set()
    if apply:
        RegistryStore(d.conn).unpublish_dag(dag_id=d.dag_id)
    for i, pub in enumerate(d.spec.publish):
        ds_uuid = d.outputs[(pub.job, pub.output_index)]
        if pub.dataset in reclaimed:
            continue  # taken back by an admin: only a deploy by one (or a grantee) restores it
        if d.actor is not None:
            names.check_publish(d.conn, d.actor, d.dag_id, pub.dataset, pub.dataset in held)
        owner = RegistryStore(d.conn).dataset_by_name(org_id=d.org_id, name=pub.dataset).fetchone()
        if owner is not None and owner["producer_dag_id"] != d.dag_id:
            # The producer is named only to whoever may read the dataset: a private DAG's
            # name is not for the rest of the org.
            other = RegistryStore(d.conn).dag_by_id(dag_id=owner["producer_dag_id"]).fetchone()
            by = f"DAG '{other['name']}'" if other and _readable(d, owner) else "another DAG"
            d.problems.append(
                DagProblem(
                    f"publish[{i}].dataset",
                    f"dataset '{pub.dataset}' is produced by {by}; "
                    "a dataset has a single producing DAG",
                )
            )
            continue
        if apply:
            RegistryStore(d.conn).publish(dataset_uuid=ds_uuid, name=pub.dataset)
        d.published[pub.dataset] = ds_uuid
    for pub in d.spec.publish if apply else []:
        if pub.hot_window is not None and {pub.dataset, pub.hot_window.of} <= d.published.keys():
            RegistryStore(d.conn).set_hot_window(
                dataset_uuid=d.published[pub.dataset],
                of=d.published[pub.hot_window.of],
                key=pub.hot_window.key,
            )


def _wire_subscriptions(d: _Deploy) -> None:
    """Subscriptions: the index the Dispatcher uses to turn an event into tasks."""
    for name, job in d.spec.jobs.items():
        for i, inp in enumerate(job.inputs):
            if isinstance(inp, JobOutputRef):
                ds_uuid: UUID | None = d.outputs[(inp.job, inp.output)]
            else:
                assert isinstance(inp, SharedRead)
                ds_uuid = _shared_dataset(d, name, i, inp)
                if ds_uuid is None:
                    continue
            RegistryStore(d.conn).insert_subscription(
                dag_id=d.dag_id,
                dag_version=d.version,
                job=name,
                input_index=i,
                dataset_uuid=ds_uuid,
                triggers=inp.triggers,
            )


def _shared_dataset(d: _Deploy, job: str, i: int, inp: SharedRead) -> UUID | None:
    """Another DAG's published dataset, if it exists and the actor may read it; else a
    problem. One the actor may not read answers exactly as one that does not exist (the
    same problem, text and status), so a deploy or dry run cannot probe for private names."""
    ds = RegistryStore(d.conn).dataset_by_name(org_id=d.org_id, name=inp.from_.dataset).fetchone()
    if ds is None or not _readable(d, ds):
        d.problems.append(
            DagProblem(
                f"jobs.{job}.inputs[{i}].from.dataset",
                f"unknown dataset '{inp.from_.dataset}'",
            )
        )
        return None
    ds_uuid: UUID = ds["dataset_uuid"]
    return ds_uuid


def _readable(d: _Deploy, ds: dict[str, Any]) -> bool:
    """May the deployer read `ds`? Without one (a cutover's check, shown by `dag status` to
    any of the DAG's deployers) no."""
    if d.actor is None:
        return False
    producer = RegistryStore(d.conn).dag_by_id(dag_id=ds["producer_dag_id"]).fetchone()
    return can_read(d.actor, ds, producer)


def _pool_slots(d: _Deploy, *, retire: bool = True) -> None:
    """Worker pool slots as the spec lists them; slots it no longer lists are retired (when
    the version goes live: the live version may still need them while another builds)."""
    pools: list[str] = []
    idxs: list[int] = []
    # With the implicit one-slot pool of each whole-scope writer without a pool (dag/whole.py).
    implicit = {pool: [PoolSlot()] for pool in implicit_pools(d.spec)}
    for pool, slots in {**d.spec.worker_pools, **implicit}.items():
        for i, slot in enumerate(slots):
            RegistryStore(d.conn).upsert_slot(
                dag_id=d.dag_id,
                pool=pool,
                slot_index=i,
                env=Jsonb(slot.env),
                secrets=Jsonb(slot.secrets),
            )
            pools.append(pool)
            idxs.append(i)
    if retire:
        RegistryStore(d.conn).retire_slots(dag_id=d.dag_id, pools=pools, idx=idxs)


def _check_secrets(d: _Deploy) -> None:
    """The secrets the slots name must exist, and the deployer must be allowed to use each
    (checked again whenever a task gets them)."""
    wanted = {
        s for slots in d.spec.worker_pools.values() for slot in slots for s in slot.secrets.values()
    }
    for row in SecretStore(d.conn).secrets_named(org_id=d.org_id, names=sorted(wanted)).fetchall():
        if row["org_id"] is None:
            d.problems.append(
                DagProblem(
                    "worker_pools",
                    f"secret '{row['name']}' is not set (trace secrets set {row['name']})",
                )
            )
        elif not can_use_secret(d.deployer, row):
            raise Forbidden(
                f"{d.source}: worker_pools: '{d.deployer.name}' may not use secret '{row['name']}' "
                "(not its owner, an admin, or in its use_roles)"
            )


def _init_cron(d: _Deploy) -> None:
    for cron in d.spec.triggers.cron:
        RegistryStore(d.conn).init_cron(dag_id=d.dag_id, trigger=cron.name)


def _go_live(d: _Deploy) -> None:
    """Nothing this version changes alters what a job produces (or it is the first): it is
    live at once, and the outputs it cut (new jobs, first deploy) are current."""
    key = {"dag_id": d.dag_id, "version": d.version}
    RolloutStore(d.conn).point_current(**key)
    RolloutStore(d.conn).make_active(**key)
    if d.dag["active_version"] is not None:
        RolloutStore(d.conn).set_version_state(
            dag_id=d.dag_id, version=d.dag["active_version"], state="retired"
        )
    RolloutStore(d.conn).set_version_state(**key, state="active")


def _replay_new_jobs(d: _Deploy, intents: Intents, dry_run: bool) -> dict[str, rollout.Replay]:
    """A job new in a version that goes live at once (a first deploy's jobs) processes the
    history its inputs already hold, planned as a rebuild replays: the newest event per scope
    of each triggering input's current version (another DAG's published data, say). Without
    it such a job waits for new upstream data that may never come."""
    new = [name for name in d.spec.jobs if name not in d.previous]
    plans = rollout.replay(
        d.conn,
        intents,
        dag=d.dag,
        version=d.version,
        spec=d.spec,
        jobs=new,
        kind="deploy",
        fired_by=d.deployer.user_id,
        dry_run=dry_run,
    )
    return {job: plan for job, plan in plans.items() if plan.tasks}


def _start_rebuild(
    d: _Deploy, intents: Intents, manual: bool, dry_run: bool
) -> dict[str, rollout.Replay]:
    """The version builds beside the live one: its rebuilt jobs replay the history they need
    (and their downstream follows as the rebuild runs); it goes live at cutover. A dry run
    only counts the replays."""
    key = {"dag_id": d.dag_id, "version": d.version}
    RolloutStore(d.conn).set_building(**key)
    RolloutStore(d.conn).set_version_state(**key, state="building")
    RolloutStore(d.conn).set_manual_cutover(**key, manual=manual)
    return rollout.replay(
        d.conn,
        intents,
        dag=d.dag,
        version=d.version,
        spec=d.spec,
        jobs=d.rebuild,
        kind="deploy",
        fired_by=d.deployer.user_id,
        dry_run=dry_run,
    )


def apply_live_spec(conn: Connection[Any], dag: dict[str, Any], spec: DagSpec) -> None:
    """What goes live with a version at its cutover or rollback: dataset shapes, published
    names and hot windows, retired pool slots. Checked at deploy; a conflict arisen since
    (another DAG took a name) refuses the change."""
    problems = live_spec_problems(conn, dag, spec)
    if problems:
        raise Conflict("publish_conflict", "; ".join(problems))
    d = _Deploy(conn, None, spec, "", f"DAG '{dag['name']}'", dag, False, {})
    _assign_datasets(d)
    _publish_names(d)
    _pool_slots(d)


def live_spec_problems(conn: Connection[Any], dag: dict[str, Any], spec: DagSpec) -> list[str]:
    """What would refuse `spec` going live now (a name another DAG publishes meanwhile);
    changes nothing."""
    d = _Deploy(conn, None, spec, "", f"DAG '{dag['name']}'", dag, False, {})
    _assign_datasets(d, shape=False)
    _publish_names(d, apply=False)
    return [f"{p.where}: {p.message}" for p in d.problems]


def _materialization(stored: dict[str, Any]) -> dict[str, Any]:
    """The materialization-affecting part of a job as stored in an earlier version's spec."""
    return JobSpec.model_validate(stored).materialization()
