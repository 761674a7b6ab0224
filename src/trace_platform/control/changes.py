"""Changing a running DAG, as its deployers see it: deploy (or only diff), follow a rebuild,
cut over, roll back, pause and resume. The mechanics are in `registry/rollout.py`; this is who
may do what, and the shape of the answers."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any
from uuid import UUID

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool

from trace_platform import audit
from trace_platform.control.backfill import Scopes, backfill
from trace_platform.dag.schema import DagSpec
from trace_platform.dag.validate import parse
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.errors import Conflict, NotFound
from trace_platform.identity import Actor, can_deploy
from trace_platform.registry import rollout
from trace_platform.registry.deploy import (
    DeployResult,
    apply_live_spec,
    deploy,
    live_spec_problems,
)
from trace_platform.store.registry import RegistryStore
from trace_platform.store.rollout import RolloutStore

log = logging.getLogger("trace.changes")


def spec_of(conn: Connection[Any], dag_id: UUID, version: int) -> DagSpec:
    row = RegistryStore(conn).dag_version(dag_id=dag_id, version=version).fetchone()
    if row is None:
        raise NotFound(f"DAG has no version {version}")
    return DagSpec.model_validate(row["spec"])


def plan_json(res: DeployResult) -> dict[str, Any]:
    """A deploy's answer: what changed, what rebuilds, what it replays, what serves now."""
    return {
        "dag_id": res.dag_id,
        "name": res.name,
        "version": res.version,
        "created": res.created,
        "live": res.live,
        "active_version": res.active_version,
        "manual_cutover": res.manual_cutover,
        "abandoned_version": res.abandoned,
        "changes": [asdict(c) for c in res.changes],
        "rebuilt_jobs": res.rebuilt_jobs,
        "replays": {
            j: {
                "tasks": r.tasks,
                "scopes": r.scopes,
                "sources": r.sources,
                "run_id": r.run_id,
            }
            for j, r in sorted(res.replays.items())
        },
        "datasets": res.datasets,
    }


def _conflicts(conn: Connection[Any], dag: dict[str, Any], spec: DagSpec) -> str | None:
    problems = live_spec_problems(conn, dag, spec)
    return f"cannot go live: {'; '.join(problems)}" if problems else None


class DagChanges:
    def __init__(self, pool: ConnectionPool, dispatcher: Dispatcher) -> None:
        self.pool = pool
        self.intents = dispatcher.intents

    def deploy(
        self,
        actor: Actor,
        source_yaml: str,
        source: str = "<request>",
        *,
        dry_run: bool = False,
        manual_cutover: bool = False,
    ) -> DeployResult:
        """Deploy, or with `dry_run` the same deploy rolled back: its answer is the diff (and
        the audit log keeps that it was asked, as `dag.diff`)."""
        spec = parse(source_yaml, source)  # every file-local problem, before touching state
        with self.pool.connection() as conn, conn.transaction():
            with conn.transaction() as tx:
                res = deploy(
                    conn,
                    actor,
                    spec,
                    source_yaml,
                    source,
                    intents=self.intents,
                    manual_cutover=manual_cutover,
                    dry_run=dry_run,
                )
                if dry_run:
                    raise psycopg.Rollback(tx)
            audit.record(
                conn,
                actor,
                "dag.diff" if dry_run else "dag.deploy",
                res.name,
                _deploy_details(res, source),
            )
        return res

    def _deployable(self, conn: Connection[Any], actor: Actor, name: str) -> dict[str, Any]:
        """The DAG, if the actor may change it; for anyone else it does not exist."""
        dag = RegistryStore(conn).dag_by_name(org_id=actor.org_id, name=name).fetchone()
        if dag is None or not can_deploy(actor, dag):
            raise NotFound(f"no DAG named '{name}'")
        return dag  # type: ignore[no-any-return]

    def status(self, actor: Actor, name: str) -> dict[str, Any]:
        """The live version, any rebuild in flight with its progress per job and the state of
        each dataset it builds, and the version history."""
        with self.pool.connection() as conn:
            dag = self._deployable(conn, actor, name)
            dag_id = dag["dag_id"]
            building = dag["building_version"]
            out: dict[str, Any] = {
                "name": dag["name"],
                "active_version": dag["active_version"],
                "building_version": building,
                "paused": dag["paused"],
                "versions": RolloutStore(conn).dag_versions(dag_id=dag_id).fetchall(),
            }
            if building is not None:
                rows = rollout.progress(conn, dag_id, building)
                v = next(r for r in out["versions"] if r["version"] == building)
                out["rebuild"] = {
                    "version": building,
                    "manual_cutover": v["manual_cutover"],
                    "jobs": rows,
                    "datasets": RolloutStore(conn)
                    .dataset_status(dag_id=dag_id, version=building)
                    .fetchall(),
                    "blocked_by": rollout.blockers(rows)
                    or _conflicts(conn, dag, spec_of(conn, dag_id, building)),
                }
        return out

    def cutover(self, actor: Actor, name: str) -> dict[str, Any]:
        with self.pool.connection() as conn, conn.transaction():
            dag = self._deployable(conn, actor, name)
            return self._cutover(conn, dag["dag_id"], actor)

    def _cutover(
        self,
        conn: Connection[Any],
        dag_id: UUID,
        actor: Actor | audit.PlatformActor,
        expect: int | None = None,
    ) -> dict[str, Any]:
        res = rollout.cutover(
            conn, self.intents, dag_id, expect=expect, spec_of=lambda d, v: spec_of(conn, d, v)
        )
        dag = RegistryStore(conn).dag_by_id(dag_id=dag_id).fetchone()
        assert dag is not None
        apply_live_spec(conn, dag, spec_of(conn, dag_id, res["version"]))
        details = {k: v for k, v in res.items() if k != "dag" and isinstance(v, int | None)}
        audit.record(
            conn,
            actor,
            "dag.cutover",
            dag["name"],
            {**details, "automatic": expect is not None},
            org_id=dag["org_id"],
        )
        return res

    def rollback(self, actor: Actor, name: str, to: int | None = None) -> dict[str, Any]:
        with self.pool.connection() as conn, conn.transaction():
            dag = self._deployable(conn, actor, name)
            dag_id = dag["dag_id"]
            res = rollout.rollback(
                conn,
                self.intents,
                dag_id,
                to=to,
                spec_of=lambda d, v: spec_of(conn, d, v),
                fired_by=actor.user_id,
            )
            if res["rolled_back"] is not None:
                live = RegistryStore(conn).dag_by_id(dag_id=dag_id).fetchone()
                apply_live_spec(conn, live, spec_of(conn, dag_id, res["version"]))
            audit.record(
                conn,
                actor,
                "dag.rollback",
                name,
                {
                    "to": to,
                    "version": res["version"],
                    "rolled_back": res["rolled_back"],
                    "abandoned": res["abandoned"],
                    "canceled": res.get("canceled", 0),
                },
            )
        return res

    def backfill(
        self,
        actor: Actor,
        name: str,
        *,
        jobs: list[str] | None = None,
        from_block: int | None = None,
        to_block: int | None = None,
        scopes: list[str] | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Replays chosen input scopes for chosen jobs of the live version (control/backfill.py)."""
        asked = Scopes(from_block, to_block, frozenset(scopes or ()))
        return backfill(
            self.pool,
            self.intents,
            actor,
            name,
            jobs=list(jobs or ()),
            scopes=asked,
            dry_run=dry_run,
        )

    def set_paused(self, actor: Actor, name: str, paused: bool) -> dict[str, Any]:
        with self.pool.connection() as conn, conn.transaction():
            dag = self._deployable(conn, actor, name)
            res = rollout.set_paused(conn, self.intents, dag["dag_id"], paused)
            audit.record(
                conn,
                actor,
                "dag.pause" if paused else "dag.resume",
                name,
                {"woken": res["woken"]},
                outcome="noop" if dag["paused"] == paused else "ok",
            )
            return res

    def auto_cutover(self) -> list[dict[str, Any]]:
        """Cuts over every rebuild that is complete and not waiting for a manual cutover."""
        done = []
        with self.pool.connection() as conn:
            candidates = RolloutStore(conn).building_dags().fetchall()
        for c in candidates:
            try:
                with self.pool.connection() as conn:
                    if rollout.blockers(rollout.progress(conn, c["dag_id"], c["building_version"])):
                        continue
                    with conn.transaction():
                        done.append(
                            self._cutover(conn, c["dag_id"], "system", c["building_version"])
                        )
            except Conflict as e:  # moved on meanwhile, or a name taken: status says why
                log.info("cutover of %s not done: %s", c["dag_id"], e)
            except Exception:  # one DAG's trouble must not stop the others' cutovers
                log.exception("cutover of %s failed", c["dag_id"])
        for d in done:
            log.info("cut over DAG %s to version %s", d["dag"], d["version"])
        return done


def _deploy_details(res: DeployResult, source: str) -> dict[str, Any]:
    return {
        "version": res.version,
        "dag_created": res.created,
        "live": res.live,
        "active_version": res.active_version,
        "manual_cutover": res.manual_cutover,
        "abandoned_version": res.abandoned,
        "source": source,
        "changes": [f"{c.change} {c.job}" for c in res.changes[:50]],
        "rebuilt_jobs": res.rebuilt_jobs[:50],
    }


def run_cutovers(changes: DagChanges, stop: Any, interval: float) -> None:
    """The loop that cuts completed rebuilds over (an API background thread)."""
    while not stop.is_set():
        try:
            changes.auto_cutover()
        except Exception:  # a bad round must not end the loop
            log.exception("automatic cutover round failed")
        stop.wait(interval)
