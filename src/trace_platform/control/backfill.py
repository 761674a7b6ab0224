"""Backfill: replay chosen input scopes for chosen jobs of a DAG's live version, as one run.

A backfill is a replay (`registry/rollout.py`) narrowed to the scopes asked for: the newest
event per scope of each triggering input's current version, each becoming a task of the job.
What those tasks commit goes through the jobs' update strategies (`replace` rewrites a scope,
`append` with a `unique_key` never repeats a key), so a backfill of scopes already done changes
nothing; the events they emit carry the work downstream as any run's do (a rewritten scope
reaches its readers as an invalidation). The run is canceled as a whole with `trace runs
cancel`: each scope commits atomically, so a canceled backfill leaves every scope either as it
was or rewritten whole, never half."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg_pool import ConnectionPool

from trace_platform import audit
from trace_platform.dag.schema import DagSpec
from trace_platform.dispatcher.intents import Intents
from trace_platform.errors import Conflict, Forbidden, Invalid, NotFound
from trace_platform.identity import Actor, can_deploy
from trace_platform.registry import rollout
from trace_platform.store.registry import RegistryStore

MAX_SCOPES_ASKED = 1000


@dataclass(frozen=True)
class Scopes:
    """Which history a backfill replays: blocks [from_block, to_block] (inclusive; a range
    scope is kept when it overlaps them), or named scopes (`range:0-100`, `partition:p`), or
    everything (neither)."""

    from_block: int | None = None
    to_block: int | None = None
    names: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        blocks = self.from_block is not None or self.to_block is not None
        if blocks and self.names:
            raise Invalid("give a block range (--from-block/--to-block) or scopes, not both")
        if blocks and (self.from_block is None or self.to_block is None):
            raise Invalid("a block range needs both --from-block and --to-block")
        if blocks and not 0 <= self.from_block <= self.to_block:  # type: ignore[operator]
            raise Invalid(
                f"--from-block {self.from_block} must be at least 0 and at most --to-block "
                f"{self.to_block}"
            )
        if len(self.names) > MAX_SCOPES_ASKED:
            raise Invalid(f"at most {MAX_SCOPES_ASKED} scopes per backfill")

    def keep(self, event: dict[str, Any], scope: str) -> bool:
        if self.names:
            return scope in self.names
        if self.from_block is None:
            return True
        rng = event.get("range")
        if not rng:  # a cursor or partition names no blocks
            return False
        # Ranges are half-open [start, end); the asked blocks are inclusive.
        return bool(rng["start"] <= self.to_block and rng["end"] > self.from_block)  # type: ignore[operator]

    def as_config(self) -> dict[str, Any]:
        return {
            "from_block": self.from_block,
            "to_block": self.to_block,
            "scopes": sorted(self.names),
        }


def _jobs(spec: DagSpec, dag_name: str, asked: list[str]) -> list[str]:
    """The jobs to backfill: those asked for (each must read an input), else every job that
    runs on its inputs' events."""
    event_driven = [n for n, j in spec.jobs.items() if any(i.triggers for i in j.inputs)]
    if not asked:
        if not event_driven:
            raise Invalid(
                f"DAG '{dag_name}' has no job that runs on its inputs: nothing to backfill "
                f"(trigger it: `trace dag trigger {dag_name}`)"
            )
        return event_driven
    for name in asked:
        if name not in spec.jobs:
            raise NotFound(
                f"DAG '{dag_name}' has no job '{name}' (its jobs: {', '.join(sorted(spec.jobs))})"
            )
        if name not in event_driven:
            raise Invalid(
                f"job '{name}' reads no input that triggers it: it runs on the DAG's triggers "
                f"(`trace dag trigger {dag_name}`), not on history"
            )
    return sorted(set(asked))


def backfill(
    pool: ConnectionPool,
    intents: Intents,
    actor: Actor,
    dag_name: str,
    *,
    jobs: list[str],
    scopes: Scopes,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Replays the chosen scopes for the chosen jobs of the DAG's live version, in one
    transaction (the DAG's change lock held, as a deploy holds it): one run, or with
    `dry_run` only the plan."""
    with pool.connection() as conn, conn.transaction():
        dag = RegistryStore(conn).dag_by_name(org_id=actor.org_id, name=dag_name).fetchone()
        if dag is None:
            raise NotFound(f"no DAG named '{dag_name}'")
        if not can_deploy(actor, dag):
            raise Forbidden(
                f"'{actor.name}' may not backfill DAG '{dag_name}': only its owner, its deploy "
                "roles and org admins may run its jobs"
            )
        dag = rollout.lock(conn, dag["dag_id"])
        version = dag["active_version"]
        if version is None:
            raise Conflict("not_deployed", f"DAG '{dag_name}' has no active version")
        row = RegistryStore(conn).dag_version(dag_id=dag["dag_id"], version=version).fetchone()
        assert row is not None
        spec = DagSpec.model_validate(row["spec"])
        chosen = _jobs(spec, dag_name, jobs)
        plans = rollout.replay(
            conn,
            intents,
            dag=dag,
            version=version,
            spec=spec,
            jobs=chosen,
            kind="backfill",
            fired_by=actor.user_id,
            dry_run=dry_run,
            keep=scopes.keep,
            config={"backfill": scopes.as_config()},
        )
        run_ids = {p.run_id for p in plans.values() if p.run_id is not None}
        run_id: UUID | None = run_ids.pop() if run_ids else None
        audit.record(
            conn,
            actor,
            "dag.backfill",
            dag_name,
            {
                "version": version,
                "jobs": chosen,
                "run_id": run_id,
                "tasks": sum(p.tasks for p in plans.values()),
                "from_block": scopes.from_block,
                "to_block": scopes.to_block,
                "scopes": sorted(scopes.names)[:50],
                "scopes_asked": len(scopes.names),
            },
            outcome="dry_run" if dry_run else "ok",
        )
    return {
        "dag": dag_name,
        "version": version,
        "dry_run": dry_run,
        "run_id": run_id,
        "tasks": sum(p.tasks for p in plans.values()),
        "jobs": {
            j: {"tasks": p.tasks, "scopes": p.scopes, "sources": p.sources}
            for j, p in sorted(plans.items())
        },
    }
