"""Deploy, trigger, datasets, secrets, runs: every operation takes the acting user."""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from psycopg_pool import ConnectionPool

from trace_platform.dag.schema import NAME
from trace_platform.dag.validate import parse
from trace_platform.db.queries import Queries
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.dag_tasks import fire
from trace_platform.dispatcher.errors import Conflict, Invalid, NotFound
from trace_platform.identity import Actor, Forbidden, can_deploy, can_read_row, require_admin
from trace_platform.registry.deploy import DeployResult, deploy

_R = Queries("registry")
_T = Queries("dag_tasks")


class ControlPlane:
    def __init__(self, pool: ConnectionPool, dispatcher: Dispatcher) -> None:
        self.pool = pool
        self.dispatcher = dispatcher

    # -- DAGs ------------------------------------------------------------------------------
    def deploy(self, actor: Actor, source_yaml: str, source: str = "<request>") -> DeployResult:
        spec = parse(source_yaml, source)  # every file-local problem, before touching state
        with self.pool.connection() as conn, conn.transaction():
            return deploy(conn, actor, spec, source_yaml, source)

    def _dag(self, conn: Any, actor: Actor, name: str) -> dict[str, Any]:
        dag = conn.execute(_R.dag_by_name, {"org_id": actor.org_id, "name": name}).fetchone()
        if dag is None:
            raise NotFound(f"no DAG named '{name}'")
        return dag  # type: ignore[no-any-return]

    def list_dags(self, actor: Actor) -> list[dict[str, Any]]:
        with self.pool.connection() as conn:
            rows = conn.execute(_R.list_dags, {"org_id": actor.org_id}).fetchall()
        return [{**r, "can_deploy": can_deploy(actor, r)} for r in rows]

    def show_dag(self, actor: Actor, name: str, version: int | None = None) -> dict[str, Any]:
        with self.pool.connection() as conn:
            dag = self._dag(conn, actor, name)
            v = conn.execute(
                _R.dag_version,
                {"dag_id": dag["dag_id"], "version": version or dag["active_version"]},
            ).fetchone()
        if v is None:
            raise NotFound(f"DAG '{name}' has no version {version}")
        return {**dag, "version": v["version"], "spec": v["spec"], "deployed_at": v["deployed_at"]}

    def set_deploy_roles(self, actor: Actor, name: str, roles: list[str]) -> None:
        require_admin(actor, "change who may deploy a DAG")
        with self.pool.connection() as conn:
            dag = self._dag(conn, actor, name)
            conn.execute(
                _R.set_deploy_roles, {"dag_id": dag["dag_id"], "roles": sorted(set(roles))}
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
        with self.pool.connection() as conn, conn.transaction():
            dag = self._dag(conn, actor, dag_name)
            if not can_deploy(actor, dag):
                raise Forbidden(f"'{actor.name}' may not trigger DAG '{dag_name}'")
            if dag["active_version"] is None:
                raise Conflict("not_deployed", f"DAG '{dag_name}' has no active version")
            if dag["paused"]:
                raise Conflict("paused", f"DAG '{dag_name}' is paused")
            spec = conn.execute(
                _R.dag_version, {"dag_id": dag["dag_id"], "version": dag["active_version"]}
            ).fetchone()["spec"]  # type: ignore[index]
            base: dict[str, Any] = {}
            if kind != "manual":
                named = {
                    t["name"]: t
                    for t in spec["triggers"][f"{kind}s" if kind == "webhook" else kind]
                }
                if trigger not in named:
                    raise NotFound(f"DAG '{dag_name}' has no {kind} trigger '{trigger}'")
                base = named[trigger].get("config", {})
            run_id, specs = fire(
                conn,
                dag=dag,
                trigger=trigger,
                kind=kind,
                fire_key=fire_key or str(uuid.uuid4()),
                config={**base, **(config or {})},
                fired_by=actor.user_id,
            )
            refs = [self.dispatcher.create_task(s, conn) for s in specs]
        return {"run_id": run_id, "created": bool(refs), "tasks": [r.task_id for r in refs]}

    # -- datasets ----------------------------------------------------------------------------
    def list_datasets(self, actor: Actor) -> list[dict[str, Any]]:
        """Only the datasets this user may read (the rest are invisible, not just locked)."""
        with self.pool.connection() as conn:
            rows = conn.execute(_R.list_datasets, {"org_id": actor.org_id}).fetchall()
        return [r for r in rows if can_read_row(actor, r)]

    def show_dataset(self, actor: Actor, name: str) -> dict[str, Any]:
        for row in self.list_datasets(actor):
            if row["dataset_name"] == name:
                return row
        # Unknown and unreadable look the same, so names do not leak.
        raise NotFound(f"no dataset named '{name}' that you can read")

    def set_read_roles(
        self, actor: Actor, name: str, add: list[str], remove: list[str]
    ) -> list[str]:
        require_admin(actor, "change a dataset's read_roles")
        for role in add:
            if not NAME.match(role):
                raise Invalid(f"role '{role}' must match ^[a-z][a-z0-9_]{{0,127}}$")
        with self.pool.connection() as conn:
            ds = conn.execute(_R.dataset_by_name, {"org_id": actor.org_id, "name": name}).fetchone()
            if ds is None:
                raise NotFound(f"no dataset named '{name}'")
            roles = sorted((set(ds["read_roles"]) | set(add)) - set(remove))
            conn.execute(_R.set_read_roles, {"dataset_uuid": ds["dataset_uuid"], "roles": roles})
        return roles

    # -- secrets -------------------------------------------------------------------------------
    def set_secret(self, actor: Actor, name: str, value: str) -> None:
        require_admin(actor, "set secrets")
        if not value:
            raise Invalid("a secret value cannot be empty")
        with self.pool.connection() as conn:
            conn.execute(_R.set_secret, {"org_id": actor.org_id, "name": name, "value": value})

    def list_secrets(self, actor: Actor) -> list[dict[str, Any]]:
        require_admin(actor, "list secrets")
        with self.pool.connection() as conn:
            return conn.execute(_R.list_secrets, {"org_id": actor.org_id}).fetchall()

    # -- runs ----------------------------------------------------------------------------------
    def list_runs(
        self, actor: Actor, dag: str | None = None, limit: int = 20
    ) -> list[dict[str, Any]]:
        with self.pool.connection() as conn:
            rows = conn.execute(
                _T.list_runs, {"org_id": actor.org_id, "dag": dag, "limit": limit}
            ).fetchall()
        for r in rows:
            r["status"] = "running" if r["active"] else ("failed" if r["failed"] else "succeeded")
        return rows

    def show_run(self, actor: Actor, run_id: UUID) -> dict[str, Any]:
        with self.pool.connection() as conn:
            f = conn.execute(_T.run_fire, {"run_id": run_id}).fetchone()
            if f is None or f["org_id"] != actor.org_id:
                raise NotFound(f"no run {run_id}")
            tasks = conn.execute(_T.run_tree, {"run_id": run_id}).fetchall()
        return {**f, "tasks": tasks}
