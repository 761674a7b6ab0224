"""Deploy, trigger, datasets, secrets, runs: every operation takes the acting user."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any
from uuid import UUID

from psycopg_pool import ConnectionPool

from trace_platform import audit
from trace_platform.contract import TaskRef, TaskSpec
from trace_platform.control.changes import DagChanges
from trace_platform.control.identity import Identities
from trace_platform.dag.schema import NAME
from trace_platform.db.replica import ReadPools
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.dag_tasks import fire
from trace_platform.dispatcher.models import CancelResponse, TaskView
from trace_platform.errors import Conflict, Gone, Invalid, NotFound
from trace_platform.identity import (
    Actor,
    Forbidden,
    can_deploy,
    can_read_row,
    require_admin,
)
from trace_platform.identity.vault import (
    can_manage_secret,
    can_use_secret,
    check_secret_name,
    vault_for,
)
from trace_platform.registry import names
from trace_platform.registry.deploy import DeployResult
from trace_platform.registry.versions import list_versions, purge
from trace_platform.retention import history, units
from trace_platform.store.dag_tasks import DagTaskStore
from trace_platform.store.registry import RegistryStore
from trace_platform.store.retention import RetentionStore
from trace_platform.store.secrets import SecretStore
from trace_platform.store.task_views import TaskViewStore
from trace_platform.store.tasks import RunRetryParams, StoreTx
from trace_platform.store.tasks.postgres import PostgresStore, PostgresTx

# Fields only the Dispatcher sets (from a DAG's deploy, its triggers and events): an ad-hoc task
# has none, so it cannot borrow a DAG's worker pool slots (and their secrets) or join its runs.
_DAG_ONLY = (
    "dag_id",
    "dag_version",
    "parent_task_id",
    "input_event_id",
    "input_event",
    "input_versions",
    "run_id",
    "worker_pool",
    "max_concurrency",
)

log = logging.getLogger(__name__)


MAX_TRIGGER_CONFIG_BYTES = 64 * 1024  # a run's config travels in every source task's event
MAX_SECRET_BYTES = 16 * 1024  # keys, tokens, URLs; not files
MAX_ROLES = 100  # given in one call (a secret's use_roles, roles added to a dataset)


def check_trigger_config(config: dict[str, Any]) -> None:
    """A run's config is at most MAX_TRIGGER_CONFIG_BYTES (as JSON), whoever fires it."""
    size = len(json.dumps(config, default=str))
    if size > MAX_TRIGGER_CONFIG_BYTES:
        raise Invalid(
            f"trigger config is {size} bytes; the limit is {MAX_TRIGGER_CONFIG_BYTES} "
            "(pass large inputs as datasets, not in the run's config)"
        )


def _check_roles(roles: list[str]) -> None:
    if len(roles) > MAX_ROLES:
        raise Invalid(f"at most {MAX_ROLES} roles at once; {len(roles)} given")
    for role in roles:
        if not NAME.fullmatch(role):
            raise Invalid(f"role '{role}' must match ^[a-z][a-z0-9_]{{0,127}}$")


def _listed(secret: dict[str, Any]) -> dict[str, Any]:
    """What a secret's row shows: never its value, nor its org and owner ids."""
    return {k: secret[k] for k in ("name", "owner", "use_roles", "updated_at")}


class ControlPlane:
    """Every operation takes the acting user; the API routes and the CLI are thin shells over
    it. Whatever a user may not see answers exactly like something that does not exist."""

    def __init__(
        self, pool: ConnectionPool, dispatcher: Dispatcher, reads: ReadPools | None = None
    ) -> None:
        self.pool = pool
        self.dispatcher = dispatcher
        # The read-only paths read through `reads` (db/replica.py; docs/operations.md, "A read
        # replica"): a streaming replica while it is fresh enough. Every write, and every read
        # a write acts on, stays on `pool`, the primary.
        self.reads = reads or ReadPools(pool)
        self.vault = vault_for(dispatcher.settings)
        self.changes = DagChanges(pool, dispatcher)
        self.identity = Identities(pool)  # users and API keys (control/identity.py)
        # Secrets stored in plaintext before migration 0008 are sealed once, at start.
        with pool.connection() as conn:
            self.vault.seal_legacy(conn)

    # -- DAGs ------------------------------------------------------------------------------
    def deploy(
        self,
        actor: Actor,
        source_yaml: str,
        source: str = "<request>",
        *,
        dry_run: bool = False,
        manual_cutover: bool = False,
    ) -> DeployResult:
        """See `DagChanges.deploy`: a change to what jobs produce builds before it goes live."""
        return self.changes.deploy(
            actor, source_yaml, source, dry_run=dry_run, manual_cutover=manual_cutover
        )

    def _dag(self, conn: Any, actor: Actor, name: str) -> dict[str, Any]:
        dag = RegistryStore(conn).dag_by_name(org_id=actor.org_id, name=name).fetchone()
        if dag is None:
            raise NotFound(f"no DAG named '{name}'")
        return dag  # type: ignore[no-any-return]

    def _deployable_dag_ids(self, conn: Any, actor: Actor) -> list[UUID]:
        rows = RegistryStore(conn).list_dags(org_id=actor.org_id).fetchall()
        return [r["dag_id"] for r in rows if can_deploy(actor, r)]

    def list_dags(self, actor: Actor) -> list[dict[str, Any]]:
        """DAGs the user may deploy, or whose published datasets they may read."""
        return self.reads.read(lambda pool: self._list_dags(pool, actor))

    def _list_dags(self, pool: ConnectionPool, actor: Actor) -> list[dict[str, Any]]:
        with pool.connection() as conn:
            rows = RegistryStore(conn).list_dags(org_id=actor.org_id).fetchall()
            datasets = RegistryStore(conn).list_datasets(org_id=actor.org_id).fetchall()
        readable = {d["producer_dag_id"] for d in datasets if can_read_row(actor, d)}
        out = []
        for r in rows:
            deployable = can_deploy(actor, r)
            if deployable or r["dag_id"] in readable:
                out.append({**r, "can_deploy": deployable})
        return out

    def show_dag(self, actor: Actor, name: str, version: int | None = None) -> dict[str, Any]:
        """The spec of a DAG: org admins and its deployers only; for anyone else it does not
        exist."""
        return self.reads.read(lambda pool: self._show_dag(pool, actor, name, version))

    def _show_dag(
        self, pool: ConnectionPool, actor: Actor, name: str, version: int | None
    ) -> dict[str, Any]:
        with pool.connection() as conn:
            dag = self._dag(conn, actor, name)
            if not can_deploy(actor, dag):
                raise NotFound(f"no DAG named '{name}'")
            v = (
                RegistryStore(conn)
                .dag_version(dag_id=dag["dag_id"], version=version or dag["active_version"])
                .fetchone()
            )
        if v is None:
            raise NotFound(f"DAG '{name}' has no version {version}")
        return {**dag, "version": v["version"], "spec": v["spec"], "deployed_at": v["deployed_at"]}

    def set_deploy_roles(self, actor: Actor, name: str, roles: list[str]) -> None:
        require_admin(actor, "change who may deploy a DAG")
        with self.pool.connection() as conn, conn.transaction():
            dag = self._dag(conn, actor, name)
            RegistryStore(conn).set_deploy_roles(dag_id=dag["dag_id"], roles=sorted(set(roles)))
            audit.record(
                conn,
                actor,
                "dag.deploy_roles",
                name,
                {"roles": sorted(set(roles)), "was": dag["deploy_roles"]},
            )

    def trigger(
        self,
        actor: Actor,
        dag_name: str,
        *,
        trigger: str = "manual",
        kind: str = "manual",
        fire_key: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Durable intent (the firing and its source tasks) + outbox, in one transaction."""
        check_trigger_config(config or {})
        with self.pool.connection() as conn, conn.transaction():
            dag = self._dag(conn, actor, dag_name)
            if not can_deploy(actor, dag):
                raise Forbidden(f"'{actor.name}' may not trigger DAG '{dag_name}'")
            if dag["active_version"] is None:
                raise Conflict("not_deployed", f"DAG '{dag_name}' has no active version")
            spec = (
                RegistryStore(conn)
                .dag_version(dag_id=dag["dag_id"], version=dag["active_version"])
                .fetchone()["spec"]
            )  # type: ignore[index]
            base: dict[str, Any] = {}
            if kind != "manual":
                named = {
                    t["name"]: t
                    for t in spec["triggers"][f"{kind}s" if kind == "webhook" else kind]
                }
                if trigger not in named:
                    raise NotFound(f"DAG '{dag_name}' has no {kind} trigger '{trigger}'")
                base = named[trigger].get("config", {})
            _refuse_without_source_jobs(dag_name, spec)
            run_id, specs = fire(
                conn,
                dag=dag,
                trigger=trigger,
                kind=kind,
                fire_key=fire_key or str(uuid.uuid4()),
                config={**base, **(config or {})},
                fired_by=actor.user_id,
            )
            refs = self.dispatcher.create_tasks(list(specs), conn)
            audit.record(
                conn,
                actor,
                "dag.trigger",
                dag_name,
                {
                    "trigger": trigger,
                    "kind": kind,
                    "run_id": run_id,
                    "tasks": len(refs),
                    "idempotency_key_given": fire_key is not None,
                    # The names only: a run's config is the user's data, kept with the run.
                    "config_fields": sorted(config or {})[:50],
                },
                outcome="ok" if refs else "noop",
            )
        return {"run_id": run_id, "created": bool(refs), "tasks": [r.task_id for r in refs]}

    # -- datasets ----------------------------------------------------------------------------
    def list_datasets(self, actor: Actor) -> list[dict[str, Any]]:
        """Only the datasets this user may read (the rest are invisible, not just locked)."""
        return self.reads.read(lambda pool: _readable_datasets(pool, actor))

    def list_buffers(
        self,
        actor: Actor,
        *,
        dataset: str | None = None,
        status: str | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """Batches published to buffered datasets this user may read, newest first: each
        pending, loaded or dead (with the reason the sink refused it)."""
        # On the primary, as the batches are: a dataset made a moment ago is not left out.
        readable = sorted(d["dataset_name"] for d in _readable_datasets(self.pool, actor))
        return self.dispatcher.buffers.list_records(  # filtered before the limit, not after
            actor.org_id, dataset=dataset, status=status, limit=limit, datasets=readable
        )

    def show_dataset(self, actor: Actor, name: str) -> dict[str, Any]:
        return self.reads.read(lambda pool: _readable_dataset(pool, actor, name))

    def set_read_roles(
        self, actor: Actor, name: str, add: list[str], remove: list[str]
    ) -> list[str]:
        require_admin(actor, "change a dataset's read_roles")
        _check_roles(add)
        with self.pool.connection() as conn, conn.transaction():
            ds = RegistryStore(conn).dataset_by_name(org_id=actor.org_id, name=name).fetchone()
            if ds is None:
                raise NotFound(f"no dataset named '{name}'")
            roles = sorted((set(ds["read_roles"]) | set(add)) - set(remove))
            RegistryStore(conn).set_read_roles(dataset_uuid=ds["dataset_uuid"], roles=roles)
            audit.record(
                conn,
                actor,
                "dataset.read_roles",
                name,
                {"added": sorted(set(add)), "removed": sorted(set(remove)), "roles": roles},
                outcome="ok" if roles != sorted(ds["read_roles"]) else "noop",
            )
        return roles

    def dataset_versions(self, actor: Actor, name: str) -> list[dict[str, Any]]:
        """Every version of a dataset, newest first: for whoever may read the dataset."""

        def read(pool: ConnectionPool) -> list[dict[str, Any]]:
            ds = _readable_dataset(pool, actor, name)
            with pool.connection() as conn:
                return list_versions(conn, ds["dataset_uuid"])

        return self.reads.read(read)

    def purge_versions(
        self, actor: Actor, name: str, keep: int, *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Purges old versions of a dataset (admins only; see `registry.versions.purge`)."""
        require_admin(actor, "purge dataset versions")
        if keep < 0:
            raise Invalid(f"keep must be 0 or more; {keep} given", fields=["keep"])
        ds = _readable_dataset(self.pool, actor, name)  # the primary's: what is purged
        with self.pool.connection() as conn, conn.transaction():
            res = purge(conn, ds, keep, dry_run=dry_run)
            purged = [r["dataset_version"] for r in res["purged"]]
            audit.record(
                conn,
                actor,
                "dataset.purge",
                name,
                {
                    "keep": keep,
                    "versions": purged[:100],
                    "purged": len(purged),
                    "commits": res["commits"],
                },
                outcome="dry_run" if dry_run else "ok" if purged else "noop",
            )
            return res

    # -- published names (registry/names.py) --------------------------------------------------
    def grant_name(
        self, actor: Actor, pattern: str, *, user: str | None = None, role: str | None = None
    ) -> dict[str, Any]:
        with self.pool.connection() as conn, conn.transaction():
            res = names.grant(conn, actor, pattern, user=user, role=role)
            audit.record(conn, actor, "name.grant", pattern, {"user": user, "role": role})
            return res

    def revoke_name(
        self, actor: Actor, pattern: str, *, user: str | None = None, role: str | None = None
    ) -> dict[str, Any]:
        with self.pool.connection() as conn, conn.transaction():
            res = names.revoke(conn, actor, pattern, user=user, role=role)
            audit.record(conn, actor, "name.revoke", pattern, {"user": user, "role": role})
            return res

    def list_names(self, actor: Actor) -> dict[str, Any]:
        with self.pool.connection() as conn:
            return names.listing(conn, actor)

    def reclaim_name(self, actor: Actor, name: str) -> dict[str, Any]:
        with self.pool.connection() as conn, conn.transaction():
            res = names.reclaim(conn, actor, name)
            audit.record(
                conn,
                actor,
                "name.reclaim",
                name,
                {"from_dag": res["dag"], "dataset_uuid": res["dataset_uuid"]},
                dag=res["dag"],
            )
            return res

    # -- secrets -------------------------------------------------------------------------------
    def set_secret(
        self, actor: Actor, name: str, value: str, use_roles: list[str] | None = None
    ) -> dict[str, Any]:
        """Any user may create a secret; only its owner or an org admin may overwrite its value
        or change its use_roles (None keeps them), and whoever writes the value owns it (so an
        admin takes back a name a user claimed first). The value is sealed before it reaches
        Postgres and is never returned."""
        check_secret_name(name)
        if not value:
            raise Invalid("a secret value cannot be empty")
        if len(value.encode()) > MAX_SECRET_BYTES:
            raise Invalid(f"a secret value is at most {MAX_SECRET_BYTES} bytes")
        if use_roles is not None:
            _check_roles(use_roles)
            use_roles = sorted(set(use_roles))
        key = {"org_id": actor.org_id, "name": name}
        sealed = self.vault.seal(actor.org_id, name, value)
        with self.pool.connection() as conn, conn.transaction():
            created = (
                SecretStore(conn)
                .insert_secret(
                    **key, ciphertext=sealed, owner=actor.user_id, use_roles=use_roles or []
                )
                .fetchone()
            )
            if created is None:
                row = SecretStore(conn).secret_for_update(**key).fetchone()
                assert row is not None
                if not can_manage_secret(actor, row):
                    raise Forbidden(
                        f"'{actor.name}' may not change secret '{name}' "
                        "(only its owner or an org admin may)"
                    )
                SecretStore(conn).update_secret(
                    **key, ciphertext=sealed, use_roles=use_roles, owner=actor.user_id
                )
            (written,) = SecretStore(conn).list_secrets(**key).fetchall()
            # Never the value: who set which name, and who may use it.
            audit.record(
                conn,
                actor,
                "secret.set",
                name,
                {"created": created is not None, "use_roles": written["use_roles"]},
            )
        return {**_listed(written), "created": created is not None}

    def list_secrets(self, actor: Actor) -> list[dict[str, Any]]:
        """Names, owners, use_roles and update times (never values): every secret of the org
        for admins, else the ones the user owns or may use."""
        with self.pool.connection() as conn:
            rows = SecretStore(conn).list_secrets(org_id=actor.org_id, name=None).fetchall()
        return [_listed(r) for r in rows if can_use_secret(actor, r)]

    # -- users ---------------------------------------------------------------------------------
    def add_user(
        self, actor: Actor, name: str, roles: list[str], is_admin: bool = False
    ) -> dict[str, Any]:
        """Org admins only: creates the user (or sets an existing one's roles and admin flag)
        and issues a new API key for them, returned once (only its hash is stored)."""
        require_admin(actor, "manage users")
        _check_roles(roles)
        return self.identity.add_user(actor, name, sorted(set(roles)), is_admin)

    # -- audit log -----------------------------------------------------------------------------
    def audit_log(
        self,
        actor: Actor,
        *,
        who: str | None = None,
        since: str | None = None,
        action: str | None = None,
        dag: str | None = None,
        limit: int = 50,
        before: str | None = None,
    ) -> dict[str, Any]:
        """A page of the org's audit log, newest first: org admins only (audit.list_entries)."""

        def read(pool: ConnectionPool) -> dict[str, Any]:
            with pool.connection() as conn:
                return audit.list_entries(
                    conn,
                    actor,
                    who=who,
                    since=since,
                    action=action,
                    dag=dag,
                    limit=limit,
                    before=before,
                )

        return self.reads.read(read)

    # -- tasks ---------------------------------------------------------------------------------
    def _visible_task(
        self, actor: Actor, task_id: UUID, pool: ConnectionPool | None = None
    ) -> None:
        """Org admins see their org's tasks; others the tasks of DAGs they may deploy. Anything
        else answers exactly like a task that does not exist."""
        with (pool or self.pool).connection() as conn:
            t = TaskViewStore(conn).task_scope(task_id=task_id).fetchone()
        visible = (
            t is not None
            and t["org_id"] == actor.org_id
            and (
                actor.is_admin
                or (t["dag_id"] is not None and can_deploy(actor, {**t, "org_id": t["dag_org_id"]}))
            )
        )
        if not visible:
            with self.pool.connection() as conn:
                note = history.exported_note(conn)
            raise NotFound(f"task {task_id} does not exist{note}")

    def create_task(self, actor: Actor, spec: TaskSpec) -> TaskRef:
        """An ad-hoc task (no DAG) in the user's org: org admins only."""
        require_admin(actor, "create ad-hoc tasks")
        given = sorted(f for f in _DAG_ONLY if f in spec.model_fields_set)
        if given:
            raise Invalid(
                f"an ad-hoc task belongs to no DAG; {', '.join(given)} are set only for DAG "
                "tasks (deploy a DAG and trigger it instead)",
                fields=given,
            )
        # Outputs name datasets by uuid only (where they live is the registry's business), and
        # never another org's.
        for o in spec.outputs:
            placed = sorted(o.model_fields_set - {"dataset_uuid", "output_index"})
            if placed:
                raise Invalid(
                    f"an ad-hoc task's outputs name datasets by dataset_uuid only; "
                    f"{', '.join(placed)} are set by deploys",
                    fields=placed,
                )
        if spec.outputs:
            with self.pool.connection() as conn:
                foreign = (
                    TaskViewStore(conn)
                    .foreign_datasets(
                        uuids=[o.dataset_uuid for o in spec.outputs], org_id=actor.org_id
                    )
                    .fetchall()
                )
            if foreign:
                raise Invalid(f"dataset {foreign[0]['dataset_uuid']} is not a dataset of your org")
        with self.pool.connection() as conn, conn.transaction():
            ref = self.dispatcher.create_task(
                spec.model_copy(update={"org_id": actor.org_id}), conn
            )
            audit.record(
                conn,
                actor,
                "task.create",
                ref.task_id,
                {"job": spec.job, "operator": spec.operator, "runtime": spec.runtime},
            )
        return ref

    def list_tasks(self, actor: Actor, limit: int = 50) -> list[dict[str, Any]]:
        """The org's most recent tasks: org admins only."""
        require_admin(actor, "list all tasks")

        def read(pool: ConnectionPool) -> list[dict[str, Any]]:
            with pool.connection() as conn:
                return TaskViewStore(conn).org_tasks(org_id=actor.org_id, limit=limit).fetchall()

        return self.reads.read(read)

    def get_task(self, actor: Actor, task_id: UUID) -> TaskView:
        def read(pool: ConnectionPool) -> TaskView:
            self._visible_task(actor, task_id, pool)
            # The primary's through the Dispatcher's own store (its sessions carry its plans).
            return self.dispatcher.get_task(
                task_id, None if pool is self.pool else PostgresStore(pool)
            )

        return self.reads.read(read)

    def cancel_task(self, actor: Actor, task_id: UUID) -> CancelResponse:
        self._visible_task(actor, task_id)

        def record(tx: StoreTx, answer: CancelResponse, changed: bool) -> None:
            assert isinstance(tx, PostgresTx)  # the control plane runs on Postgres
            audit.record(
                tx.conn,
                actor,
                "task.cancel",
                task_id,
                {"status": answer.status},
                outcome="ok" if changed else "noop",
            )

        return self.dispatcher.cancel(task_id, then=record)

    # -- runs ----------------------------------------------------------------------------------
    def list_runs(
        self, actor: Actor, dag: str | None = None, limit: int = 20
    ) -> list[dict[str, Any]]:
        """Runs of the DAGs the user may deploy (all of the org's for admins)."""

        def read(pool: ConnectionPool) -> list[dict[str, Any]]:
            with pool.connection() as conn:
                return (
                    DagTaskStore(conn)
                    .list_runs(
                        org_id=actor.org_id,
                        dag_ids=self._deployable_dag_ids(conn, actor),
                        dag=dag,
                        limit=limit,
                    )
                    .fetchall()
                )

        rows = self.reads.read(read)
        for r in rows:
            r["status"] = run_status(r)
        return rows

    def cancel_run(self, actor: Actor, run_id: UUID) -> dict[str, Any]:
        """Cancels every task of the run that has not finished (a backfill, a trigger's run),
        for org admins and its DAG's deployers. Running tasks stop cooperatively and emit
        nothing; a task that finished meanwhile may have started children, so passes repeat
        until one finds nothing left to cancel."""
        # Who may see it may cancel it; others: not found. The primary's (a run just fired).
        run = self._visible_run(self.pool, actor, run_id)
        canceled: dict[UUID, str] = {}  # task -> its status after: canceled, or running (asked)
        try:
            self._cancel_run_tasks(run_id, run, canceled)
        except Exception as e:
            # Each batch's cancel committed on its own: those done stay done, and the log says
            # so (and where it stopped), unless the database cannot take the row either.
            if canceled:
                try:
                    self._record_run_cancel(actor, run, canceled, stopped=e)
                except Exception:
                    log.exception("run %s: the audit row of a half-done cancel failed", run_id)
            raise
        self._record_run_cancel(actor, run, canceled)
        return {"run_id": run_id, "canceled": len(canceled)}

    def _cancel_run_tasks(
        self, run_id: UUID, run: dict[str, Any], canceled: dict[UUID, str]
    ) -> None:
        """Fills `canceled` as each batch's cancel commits: tasks this call changed only, not a
        running one whose cancel was asked before (it is stopping already)."""
        for _ in range(_CANCEL_PASSES):
            with self.pool.connection() as conn:
                tasks = (
                    DagTaskStore(conn)
                    .run_tree(run_id=run_id, first_day=run["first_day"], last_day=run["last_day"])
                    .fetchall()
                )
            todo = [
                t["task_id"]
                for t in tasks
                if t["status"] in ("queued", "running", "buffered")
                and not t["cancel_requested"]
                and t["task_id"] not in canceled
            ]
            if not todo:
                break
            # A batch a transaction (one commit for many: a backfill's thousands of tasks one
            # at a time took a commit each); one that finished meanwhile is left out, and the
            # next pass sees its children.
            for i in range(0, len(todo), _CANCEL_BATCH):
                answers = self.dispatcher.cancel_many(todo[i : i + _CANCEL_BATCH])
                canceled.update((t, a.status) for t, a in answers.items())

    def _record_run_cancel(
        self,
        actor: Actor,
        run: dict[str, Any],
        canceled: dict[UUID, str],
        stopped: Exception | None = None,
    ) -> None:
        """The cancel's one row, in its own transaction after the tasks' batches (each its
        own): what it canceled, and if it stopped on an error, that error."""
        details: dict[str, Any] = {
            "canceled": len(canceled),
            "waiting": sum(1 for s in canceled.values() if s == "canceled"),
            "stopping": sum(1 for s in canceled.values() if s == "running"),
            "tasks": [str(t) for t in list(canceled)[:100]],
        }
        if stopped is not None:
            first = (str(stopped).splitlines() or [""])[0]
            details["stopped_by"] = f"{type(stopped).__name__}: {first}"
        with self.pool.connection() as conn, conn.transaction():
            audit.record(
                conn,
                actor,
                "run.cancel",
                run["run_id"],
                details,
                dag=run["dag"],
                outcome="ok" if canceled else "noop",
            )

    def retry_run(self, actor: Actor, run_id: UUID) -> dict[str, Any]:
        """Queues again each task of the run that ended failed (timed out or lost its lease on
        its last try included), at once, with a fresh budget of tries; its next attempt is
        N+1, so no report of an attempt from before lands. Canceled tasks stay canceled (a
        cancel was someone's decision: `trigger` runs the DAG again), and so does a failed one
        whose cancel was asked. Tasks under a failed one were never made: they follow when it
        succeeds. For org admins and the DAG's deployers, as cancel; refused for a paused DAG
        or a run of a version no longer live (retired by a cutover, rolled back, abandoned).
        Who may, the refusals and the audit row are the control plane's; the re-queue and the
        wake-ups are the Dispatcher's (`retry_run`), as a cancel's are."""
        run = self._visible_run(self.pool, actor, run_id)

        def check(tx: StoreTx) -> None:
            # One check of the DAG and the run's version, in the Dispatcher's transaction under
            # the DAG's shared change lock: no cutover or rollback between it and the re-queue.
            assert isinstance(tx, PostgresTx)  # the control plane runs on Postgres
            dag = (
                DagTaskStore(tx.conn)
                .run_version_state(dag_id=run["dag_id"], version=run["dag_version"])
                .fetchone()
            )
            assert dag is not None  # a fire's DAG is never deleted (a foreign key)
            if dag["paused"]:
                raise Conflict(
                    "dag_paused",
                    f"DAG '{run['dag']}' is paused: resume it to retry run {run_id}",
                )
            if dag["version_state"] not in ("active", "building"):
                raise Conflict(
                    "version_not_live",
                    f"run {run_id} is of DAG '{run['dag']}' version {run['dag_version']}, which "
                    f"is {(dag['version_state'] or 'gone').replace('_', ' ')} (the live one is "
                    f"{dag['active_version']}): trigger a new run instead",
                )
            # Retention takes whole months before this one: a task of such a month queued
            # again while its month is exported would outlive its registry rows, queued for
            # ever. Retention plans under its lock, so it sees what this retry commits.
            if run["first_day"] < units.month_start_day(run["last_day"]) and not (
                RetentionStore(tx.conn).hold_off()
            ):
                raise Conflict(
                    "retention_running",
                    f"retention is taking old months of history: retry run {run_id} after it",
                )

        def record(tx: StoreTx, retried: list[dict[str, Any]]) -> None:
            assert isinstance(tx, PostgresTx)
            audit.record(
                tx.conn,
                actor,
                "run.retry",
                run_id,
                {
                    "retried": len(retried),
                    "tasks": [
                        {"task_id": str(t["task_id"]), "job": t["job"], "after": t["attempt"]}
                        for t in retried[:100]
                    ],
                },
                dag=run["dag"],
                outcome="ok" if retried else "noop",
            )

        retried = self.dispatcher.retry_run(
            RunRetryParams(
                run_id=run_id,
                dag_id=run["dag_id"],
                dag_version=run["dag_version"],
                first_day=run["first_day"],
                last_day=run["last_day"],
                retried_by=actor.user_id,
            ),
            check=check,
            then=record,
        )
        return {
            "run_id": run_id,
            "retried": len(retried),
            "tasks": [t["task_id"] for t in retried],
            "message": f"{len(retried)} failed task(s) queued again"
            if retried
            else "nothing to retry: no task of this run ended failed",
        }

    def show_run(self, actor: Actor, run_id: UUID) -> dict[str, Any]:
        """A run and its task tree, for org admins and its DAG's deployers; for anyone else
        (another org included) it does not exist."""
        return self.reads.read(lambda pool: self._show_run(pool, actor, run_id))

    def _show_run(self, pool: ConnectionPool, actor: Actor, run_id: UUID) -> dict[str, Any]:
        f = self._visible_run(pool, actor, run_id)
        with pool.connection() as conn:
            tasks = (
                DagTaskStore(conn)
                .run_tree(run_id=run_id, first_day=f["first_day"], last_day=f["last_day"])
                .fetchall()
            )
        return {**f, "tasks": tasks}

    def _visible_run(self, pool: ConnectionPool, actor: Actor, run_id: UUID) -> dict[str, Any]:
        """The run's fire row (its DAG, version and days), if `actor` may see the run."""
        with pool.connection() as conn:
            f = DagTaskStore(conn).run_fire(run_id=run_id).fetchone()
            if f is None or not can_deploy(actor, f):
                raise NotFound(f"no run {run_id}")
            # Its first day's month exported and dropped (trace admin retention): say where
            # it went rather than show a tree with its beginning missing.
            if gone := history.exported_run(conn, f["first_day"]):
                raise Gone(f"run {run_id} is history: {gone}")
        return dict(f)


_CANCEL_PASSES = 10
_CANCEL_BATCH = 500  # tasks a transaction when a run is canceled


def _readable_datasets(pool: ConnectionPool, actor: Actor) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        rows = RegistryStore(conn).list_datasets(org_id=actor.org_id).fetchall()
    return [r for r in rows if can_read_row(actor, r)]


def _readable_dataset(pool: ConnectionPool, actor: Actor, name: str) -> dict[str, Any]:
    for row in _readable_datasets(pool, actor):
        if row["dataset_name"] == name:
            return row
    # Unknown and unreadable look the same, so names do not leak.
    raise NotFound(f"no dataset named '{name}' that you can read")


def run_status(r: dict[str, Any]) -> str:
    """A run's status from its task counts: a run that started no task did no work, and says
    so (`empty`), rather than `succeeded`."""
    if r["active"]:
        return "running"
    if r["failed"]:
        return "failed"
    if not r["tasks"]:
        return "empty"
    if r.get("canceled") and not r["succeeded"]:
        return "canceled"
    return "succeeded"


def _refuse_without_source_jobs(dag_name: str, spec: dict[str, Any]) -> None:
    """A trigger starts a DAG's source jobs (those reading no input). Every job of this one runs
    on its inputs' events: a firing would start nothing, so it is refused, saying how to
    process the history those inputs already hold."""
    jobs = spec.get("jobs") or {}
    if any(not j.get("inputs") for j in jobs.values()):
        return
    raise Conflict(
        "no_source_job",
        f"DAG '{dag_name}' has no source job: every job runs on its inputs' events "
        f"({', '.join(sorted(jobs))}), so a trigger would start nothing. New data upstream "
        f"starts them; to process what their inputs already hold, backfill: "
        f"`trace dag backfill {dag_name}` (POST /v1/dags/{dag_name}/backfill)",
    )
