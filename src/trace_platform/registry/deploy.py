"""Deploy: one transaction that stores an immutable dag_version, registers every job output as
a dataset, publishes names, cuts new dataset versions for changed jobs (and everything
downstream of them), wires subscriptions and pool slots, and activates the version. Any problem
rolls all of it back: nothing is ever half-deployed."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.types.json import Jsonb

from trace_platform.dag.schema import DagSpec, JobOutputRef, JobSpec, SharedRead
from trace_platform.dag.validate import DagInvalid, DagProblem
from trace_platform.db.queries import Queries
from trace_platform.identity import Actor, Forbidden, can_deploy, can_read
from trace_platform.identity.vault import can_use_secret

_Q = Queries("registry")
_S = Queries("secrets")


def dataset_location(org_id: UUID, dataset_uuid: UUID, backend: str) -> str:
    if backend == "postgres":
        return f"dataset_{dataset_uuid.hex}"
    return f"org/{org_id}/dataset/{dataset_uuid}/"


def version_location(org_id: UUID, dataset_uuid: UUID, version: UUID, backend: str) -> str:
    if backend == "postgres":  # schema per dataset, table per version: both UUID-named
        return f"dataset_{dataset_uuid.hex}.v_{version.hex}"
    return f"org/{org_id}/dataset/{dataset_uuid}/version/{version}/"


@dataclass
class DeployResult:
    dag_id: UUID
    name: str
    version: int
    created: bool
    rebuilt_jobs: list[str] = field(default_factory=list)
    datasets: dict[str, UUID] = field(default_factory=dict)  # published name -> uuid


def _downstream(spec: DagSpec, changed: set[str]) -> set[str]:
    """The changed jobs plus everything that depends on them, transitively."""
    out = set(changed)
    grew = True
    while grew:
        grew = False
        for name, job in spec.jobs.items():
            if name in out:
                continue
            if any(isinstance(i, JobOutputRef) and i.job in out for i in job.inputs):
                out.add(name)
                grew = True
    return out


@dataclass
class _Deploy:
    """What one deploy's steps share: the caller's connection and transaction, who deploys
    what, and what the steps before have decided."""

    conn: Connection[Any]
    actor: Actor
    spec: DagSpec
    source_yaml: str
    source: str
    dag_id: UUID
    created: bool
    previous: dict[str, Any]  # the active version's jobs, as stored ({} on a first deploy)
    version: int = 0
    rebuild: set[str] = field(default_factory=set)
    outputs: dict[tuple[str, int], UUID] = field(default_factory=dict)  # (job, idx) -> dataset
    published: dict[str, UUID] = field(default_factory=dict)
    problems: list[DagProblem] = field(default_factory=list)


def deploy(
    conn: Connection[Any], actor: Actor, spec: DagSpec, source_yaml: str, source: str
) -> DeployResult:
    """Run inside the caller's transaction; raises DagInvalid/Forbidden to roll it all back.
    `spec` is what `parse(source_yaml)` returned: every file-local check (the size caps
    included) has passed before a transaction is opened."""
    d = _lock_dag(conn, actor, spec, source_yaml, source)
    _store_version(d)
    _reset_rebuilt_jobs(d)
    _assign_datasets(d)
    _cut_versions(d)
    _publish_names(d)
    _wire_subscriptions(d)
    _pool_slots(d)
    _check_secrets(d)
    _init_cron(d)
    _activate(d)
    return DeployResult(d.dag_id, spec.name, d.version, d.created, sorted(d.rebuild), d.published)


def _lock_dag(
    conn: Connection[Any], actor: Actor, spec: DagSpec, source_yaml: str, source: str
) -> _Deploy:
    """The DAG row (made on a first deploy), locked, once the actor may deploy it."""
    created = (
        conn.execute(
            _Q.insert_dag,
            {
                "dag_id": uuid.uuid4(),
                "org_id": actor.org_id,
                "name": spec.name,
                "owner": actor.user_id,
            },
        ).rowcount
        == 1
    )
    dag = conn.execute(_Q.dag_for_update, {"org_id": actor.org_id, "name": spec.name}).fetchone()
    assert dag is not None
    if not can_deploy(actor, dag):
        raise Forbidden(
            f"'{actor.name}' may not deploy DAG '{spec.name}' (not its owner, an admin, or in its deploy roles)"
        )
    dag_id: UUID = dag["dag_id"]
    previous: dict[str, Any] = {}
    if dag["active_version"] is not None:
        prev = conn.execute(
            _Q.dag_version, {"dag_id": dag_id, "version": dag["active_version"]}
        ).fetchone()
        previous = prev["spec"]["jobs"] if prev else {}
    return _Deploy(conn, actor, spec, source_yaml, source, dag_id, created, previous)


def _store_version(d: _Deploy) -> None:
    """The immutable dag_version: the spec as deployed, its source and checksum."""
    d.version = d.conn.execute(_Q.next_version, {"dag_id": d.dag_id}).fetchone()["v"]  # type: ignore[index]
    d.conn.execute(
        _Q.insert_dag_version,
        {
            "dag_id": d.dag_id,
            "version": d.version,
            "spec": Jsonb(d.spec.model_dump(mode="json", by_alias=True)),
            "source_yaml": d.source_yaml,
            "checksum": hashlib.sha256(d.source_yaml.encode()).hexdigest(),
            "deployed_by": d.actor.user_id,
        },
    )


def _reset_rebuilt_jobs(d: _Deploy) -> None:
    """Which jobs produce different data now: edited ones and all their downstream."""
    changed = {
        name
        for name, job in d.spec.jobs.items()
        if name not in d.previous or _materialization(d.previous[name]) != job.materialization()
    }
    d.rebuild = _downstream(d.spec, changed)
    if d.previous and d.rebuild:
        # Rebuilt jobs start over on their new, empty versions: state such as an aggregator's
        # coverage or a tip follower's cursor described the old ones.
        d.conn.execute(_Q.reset_operator_state, {"dag_id": d.dag_id, "jobs": sorted(d.rebuild)})


def _assign_datasets(d: _Deploy) -> None:
    """Every output is a dataset with a stable identity, kept across versions of the DAG."""
    for name, job in d.spec.jobs.items():
        for idx, out in enumerate(job.outputs):
            row = d.conn.execute(
                _Q.dataset_by_producer, {"dag_id": d.dag_id, "job": name, "idx": idx}
            ).fetchone()
            ds_uuid: UUID = row["dataset_uuid"] if row else uuid.uuid4()
            shape = {
                "dataset_uuid": ds_uuid,
                "backend": out.backend,
                "location": dataset_location(d.actor.org_id, ds_uuid, out.backend),
                "update_strategy": out.update_strategy,
                "unique_key": out.unique_key,
            }
            if row is None:
                d.conn.execute(
                    _Q.insert_dataset,
                    {
                        **shape,
                        "org_id": d.actor.org_id,
                        "dag_id": d.dag_id,
                        "job": name,
                        "idx": idx,
                    },
                )
            else:
                d.conn.execute(_Q.update_dataset_shape, shape)
            d.outputs[(name, idx)] = ds_uuid


def _cut_versions(d: _Deploy) -> None:
    """A rebuilt job's outputs (and any without one yet) get a new, empty current version."""
    for name, job in d.spec.jobs.items():
        for idx, out in enumerate(job.outputs):
            ds_uuid = d.outputs[(name, idx)]
            has_current = d.conn.execute(_Q.current_version, {"dataset_uuid": ds_uuid}).fetchone()
            if name in d.rebuild or not has_current:
                ver = uuid.uuid4()
                d.conn.execute(
                    _Q.insert_dataset_version,
                    {
                        "dataset_version": ver,
                        "dataset_uuid": ds_uuid,
                        "dag_id": d.dag_id,
                        "dag_version": d.version,
                        "location": version_location(d.actor.org_id, ds_uuid, ver, out.backend),
                    },
                )
                d.conn.execute(_Q.swap_current, {"dataset_uuid": ds_uuid, "dataset_version": ver})


def _publish_names(d: _Deploy) -> None:
    """Publishing is metadata only: names move, data does not."""
    d.conn.execute(_Q.unpublish_dag, {"dag_id": d.dag_id})
    for i, pub in enumerate(d.spec.publish):
        ds_uuid = d.outputs[(pub.job, pub.output_index)]
        owner = d.conn.execute(
            _Q.dataset_by_name, {"org_id": d.actor.org_id, "name": pub.dataset}
        ).fetchone()
        if owner is not None and owner["producer_dag_id"] != d.dag_id:
            other = d.conn.execute(_Q.dag_by_id, {"dag_id": owner["producer_dag_id"]}).fetchone()
            d.problems.append(
                DagProblem(
                    f"publish[{i}].dataset",
                    f"dataset '{pub.dataset}' is produced by DAG '{other['name'] if other else '?'}'; "
                    "a dataset has a single producing DAG",
                )
            )
            continue
        d.conn.execute(_Q.publish, {"dataset_uuid": ds_uuid, "name": pub.dataset})
        d.published[pub.dataset] = ds_uuid
    for pub in d.spec.publish:
        if pub.hot_window is not None and {pub.dataset, pub.hot_window.of} <= d.published.keys():
            d.conn.execute(
                _Q.set_hot_window,
                {
                    "dataset_uuid": d.published[pub.dataset],
                    "of": d.published[pub.hot_window.of],
                    "key": pub.hot_window.key,
                },
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
            d.conn.execute(
                _Q.insert_subscription,
                {
                    "dag_id": d.dag_id,
                    "dag_version": d.version,
                    "job": name,
                    "input_index": i,
                    "dataset_uuid": ds_uuid,
                    "triggers": inp.triggers,
                },
            )


def _shared_dataset(d: _Deploy, job: str, i: int, inp: SharedRead) -> UUID | None:
    """Another DAG's published dataset, if it exists (else a problem) and the actor may read it."""
    ds = d.conn.execute(
        _Q.dataset_by_name, {"org_id": d.actor.org_id, "name": inp.from_.dataset}
    ).fetchone()
    if ds is None:
        d.problems.append(
            DagProblem(
                f"jobs.{job}.inputs[{i}].from.dataset",
                f"unknown dataset '{inp.from_.dataset}'",
            )
        )
        return None
    producer = d.conn.execute(_Q.dag_by_id, {"dag_id": ds["producer_dag_id"]}).fetchone()
    if not can_read(d.actor, ds, producer):
        raise Forbidden(
            f"{d.source}: jobs.{job}.inputs[{i}]: '{d.actor.name}' may not read dataset "
            f"'{inp.from_.dataset}' (not in its read_roles)"
        )
    ds_uuid: UUID = ds["dataset_uuid"]
    return ds_uuid


def _pool_slots(d: _Deploy) -> None:
    """Worker pool slots as the spec lists them; slots it no longer lists are retired."""
    pools: list[str] = []
    idxs: list[int] = []
    for pool, slots in d.spec.worker_pools.items():
        for i, slot in enumerate(slots):
            d.conn.execute(
                _Q.upsert_slot,
                {
                    "dag_id": d.dag_id,
                    "pool": pool,
                    "slot_index": i,
                    "env": Jsonb(slot.env),
                    "secrets": Jsonb(slot.secrets),
                },
            )
            pools.append(pool)
            idxs.append(i)
    d.conn.execute(_Q.retire_slots, {"dag_id": d.dag_id, "pools": pools, "idx": idxs})


def _check_secrets(d: _Deploy) -> None:
    """The secrets the slots name must exist, and the deployer must be allowed to use each
    (checked again whenever a task gets them)."""
    wanted = {
        s for slots in d.spec.worker_pools.values() for slot in slots for s in slot.secrets.values()
    }
    for row in d.conn.execute(
        _S.secrets_named, {"org_id": d.actor.org_id, "names": sorted(wanted)}
    ).fetchall():
        if row["org_id"] is None:
            d.problems.append(
                DagProblem(
                    "worker_pools",
                    f"secret '{row['name']}' is not set (trace secrets set {row['name']})",
                )
            )
        elif not can_use_secret(d.actor, row):
            raise Forbidden(
                f"{d.source}: worker_pools: '{d.actor.name}' may not use secret '{row['name']}' "
                "(not its owner, an admin, or in its use_roles)"
            )


def _init_cron(d: _Deploy) -> None:
    for cron in d.spec.triggers.cron:
        d.conn.execute(_Q.init_cron, {"dag_id": d.dag_id, "trigger": cron.name})


def _activate(d: _Deploy) -> None:
    """The last step: any problem found on the way raises here, so nothing above stays."""
    if d.problems:
        raise DagInvalid(d.source, d.problems)
    d.conn.execute(_Q.activate, {"dag_id": d.dag_id, "version": d.version})


def _materialization(stored: dict[str, Any]) -> dict[str, Any]:
    """The materialization-affecting part of a job as stored in an earlier version's spec."""
    return JobSpec.model_validate(stored).materialization()
