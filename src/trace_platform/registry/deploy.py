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

from trace_platform.dag.loader import MAX_DOCUMENT_BYTES
from trace_platform.dag.schema import DagSpec, JobOutputRef, JobSpec, SharedRead
from trace_platform.dag.validate import DagInvalid, DagProblem, spec_size_problems
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


def deploy(
    conn: Connection[Any], actor: Actor, spec: DagSpec, source_yaml: str, source: str
) -> DeployResult:
    """Run inside the caller's transaction; raises DagInvalid/Forbidden to roll it all back."""
    # parse() refuses these first; a direct caller is held to the same caps before any write.
    too_big = spec_size_problems(spec)
    if len(source_yaml.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES:
        too_big.append(DagProblem("", f"document is over {MAX_DOCUMENT_BYTES:,} bytes"))
    if too_big:
        raise DagInvalid(source, too_big)
    problems: list[DagProblem] = []
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
    version = conn.execute(_Q.next_version, {"dag_id": dag_id}).fetchone()["v"]  # type: ignore[index]
    spec_json = spec.model_dump(mode="json", by_alias=True)
    conn.execute(
        _Q.insert_dag_version,
        {
            "dag_id": dag_id,
            "version": version,
            "spec": Jsonb(spec_json),
            "source_yaml": source_yaml,
            "checksum": hashlib.sha256(source_yaml.encode()).hexdigest(),
            "deployed_by": actor.user_id,
        },
    )

    # Which jobs produce different data now: edited ones and all their downstream.
    changed = {
        name
        for name, job in spec.jobs.items()
        if name not in previous or _materialization(previous[name]) != job.materialization()
    }
    rebuild = _downstream(spec, changed)
    if previous and rebuild:
        # Rebuilt jobs start over on their new, empty versions: state such as an aggregator's
        # coverage or a tip follower's cursor described the old ones.
        conn.execute(_Q.reset_operator_state, {"dag_id": dag_id, "jobs": sorted(rebuild)})

    # Every output is a dataset with a stable identity; rebuilt ones get a new version.
    outputs: dict[tuple[str, int], UUID] = {}
    for name, job in spec.jobs.items():
        for idx, out in enumerate(job.outputs):
            row = conn.execute(
                _Q.dataset_by_producer, {"dag_id": dag_id, "job": name, "idx": idx}
            ).fetchone()
            ds_uuid: UUID = row["dataset_uuid"] if row else uuid.uuid4()
            shape = {
                "dataset_uuid": ds_uuid,
                "backend": out.backend,
                "location": dataset_location(actor.org_id, ds_uuid, out.backend),
                "update_strategy": out.update_strategy,
                "unique_key": out.unique_key,
            }
            if row is None:
                conn.execute(
                    _Q.insert_dataset,
                    {**shape, "org_id": actor.org_id, "dag_id": dag_id, "job": name, "idx": idx},
                )
            else:
                conn.execute(_Q.update_dataset_shape, shape)
            outputs[(name, idx)] = ds_uuid
            has_current = conn.execute(_Q.current_version, {"dataset_uuid": ds_uuid}).fetchone()
            if name in rebuild or not has_current:
                ver = uuid.uuid4()
                conn.execute(
                    _Q.insert_dataset_version,
                    {
                        "dataset_version": ver,
                        "dataset_uuid": ds_uuid,
                        "dag_id": dag_id,
                        "dag_version": version,
                        "location": version_location(actor.org_id, ds_uuid, ver, out.backend),
                    },
                )
                conn.execute(_Q.swap_current, {"dataset_uuid": ds_uuid, "dataset_version": ver})

    # Publishing is metadata only: names move, data does not.
    conn.execute(_Q.unpublish_dag, {"dag_id": dag_id})
    published: dict[str, UUID] = {}
    for i, pub in enumerate(spec.publish):
        ds_uuid = outputs[(pub.job, pub.output_index)]
        owner = conn.execute(
            _Q.dataset_by_name, {"org_id": actor.org_id, "name": pub.dataset}
        ).fetchone()
        if owner is not None and owner["producer_dag_id"] != dag_id:
            other = conn.execute(_Q.dag_by_id, {"dag_id": owner["producer_dag_id"]}).fetchone()
            problems.append(
                DagProblem(
                    f"publish[{i}].dataset",
                    f"dataset '{pub.dataset}' is produced by DAG '{other['name'] if other else '?'}'; "
                    "a dataset has a single producing DAG",
                )
            )
            continue
        conn.execute(_Q.publish, {"dataset_uuid": ds_uuid, "name": pub.dataset})
        published[pub.dataset] = ds_uuid
    for pub in spec.publish:
        if pub.hot_window is not None and {pub.dataset, pub.hot_window.of} <= published.keys():
            conn.execute(
                _Q.set_hot_window,
                {
                    "dataset_uuid": published[pub.dataset],
                    "of": published[pub.hot_window.of],
                    "key": pub.hot_window.key,
                },
            )

    # Subscriptions: the index the Dispatcher uses to turn an event into tasks.
    for name, job in spec.jobs.items():
        for i, inp in enumerate(job.inputs):
            if isinstance(inp, JobOutputRef):
                ds_uuid = outputs[(inp.job, inp.output)]
            else:
                assert isinstance(inp, SharedRead)
                ds = conn.execute(
                    _Q.dataset_by_name, {"org_id": actor.org_id, "name": inp.from_.dataset}
                ).fetchone()
                if ds is None:
                    problems.append(
                        DagProblem(
                            f"jobs.{name}.inputs[{i}].from.dataset",
                            f"unknown dataset '{inp.from_.dataset}'",
                        )
                    )
                    continue
                producer = conn.execute(_Q.dag_by_id, {"dag_id": ds["producer_dag_id"]}).fetchone()
                if not can_read(actor, ds, producer):
                    raise Forbidden(
                        f"{source}: jobs.{name}.inputs[{i}]: '{actor.name}' may not read dataset "
                        f"'{inp.from_.dataset}' (not in its read_roles)"
                    )
                ds_uuid = ds["dataset_uuid"]
            conn.execute(
                _Q.insert_subscription,
                {
                    "dag_id": dag_id,
                    "dag_version": version,
                    "job": name,
                    "input_index": i,
                    "dataset_uuid": ds_uuid,
                    "triggers": inp.triggers,
                },
            )

    # Worker pool slots, and the secrets they name must exist...
    pools: list[str] = []
    idxs: list[int] = []
    wanted: set[str] = set()
    for pool, slots in spec.worker_pools.items():
        for i, slot in enumerate(slots):
            conn.execute(
                _Q.upsert_slot,
                {
                    "dag_id": dag_id,
                    "pool": pool,
                    "slot_index": i,
                    "env": Jsonb(slot.env),
                    "secrets": Jsonb(slot.secrets),
                },
            )
            pools.append(pool)
            idxs.append(i)
            wanted.update(slot.secrets.values())
    conn.execute(_Q.retire_slots, {"dag_id": dag_id, "pools": pools, "idx": idxs})
    # ...and the deployer must be allowed to use each (checked again whenever a task gets them).
    for row in conn.execute(
        _S.secrets_named, {"org_id": actor.org_id, "names": sorted(wanted)}
    ).fetchall():
        if row["org_id"] is None:
            problems.append(
                DagProblem(
                    "worker_pools",
                    f"secret '{row['name']}' is not set (trace secrets set {row['name']})",
                )
            )
        elif not can_use_secret(actor, row):
            raise Forbidden(
                f"{source}: worker_pools: '{actor.name}' may not use secret '{row['name']}' "
                "(not its owner, an admin, or in its use_roles)"
            )

    for cron in spec.triggers.cron:
        conn.execute(_Q.init_cron, {"dag_id": dag_id, "trigger": cron.name})

    if problems:
        raise DagInvalid(source, problems)
    conn.execute(_Q.activate, {"dag_id": dag_id, "version": version})
    return DeployResult(dag_id, spec.name, version, created, sorted(rebuild), published)


def _materialization(stored: dict[str, Any]) -> dict[str, Any]:
    """The materialization-affecting part of a job as stored in an earlier version's spec."""
    return JobSpec.model_validate(stored).materialization()
