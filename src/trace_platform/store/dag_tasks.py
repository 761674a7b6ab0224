"""The state store's `dag_tasks` calls (`db/sql/dag_tasks.sql`)."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from psycopg import Cursor
from psycopg.types.json import Jsonb

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("dag_tasks")


class DagTaskStore(Calls):
    """The calls of `db/sql/dag_tasks.sql`, each with its parameters by name and type, on the
    caller's connection (inside the caller's transaction); each returns its cursor."""

    def version_spec(self, *, dag_id: UUID, version: int) -> Cursor[Row]:
        return self._run(_Q.version_spec, {"dag_id": dag_id, "version": version})

    def job_outputs(self, *, dag_id: UUID, version: int, job: str) -> Cursor[Row]:
        """What the job writes in this DAG version: each output's dataset version from the version's
        map."""
        return self._run(_Q.job_outputs, {"dag_id": dag_id, "version": version, "job": job})

    def job_inputs(self, *, dag_id: UUID, version: int, job: str) -> Cursor[Row]:
        """Each input pinned for the whole life of the task: a dataset of the same DAG at the version
        this DAG version writes (a rebuild reads what it rebuilds), another DAG's at its
        current one."""
        return self._run(_Q.job_inputs, {"dag_id": dag_id, "version": version, "job": job})

    def lock_dags_shared(self, *, dataset_uuid: UUID) -> Cursor[Row]:
        """Fan-out holds the subscribing DAGs' locks shared, so a deploy, cutover or rollback (which
        takes them exclusive) sees each event either wholly before it or wholly after."""
        return self._run(_Q.lock_dags_shared, {"dataset_uuid": dataset_uuid})

    def lock_dag_shared(self, *, dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.lock_dag_shared, {"dag_id": dag_id})

    def subscribers(
        self,
        *,
        producer_dag: UUID,
        producer_version: int,
        dataset_uuid: UUID,
        org_id: UUID,
        written: Jsonb,
    ) -> Cursor[Row]:
        """Who gets a task for an event on a dataset, written to dataset version `written`: * in the
        producer's own DAG, each live version (active, building) whose map has exactly
        that version, so a rebuild's output feeds only the rebuild and a late task of a
        retired version feeds nobody unless what it wrote is still live; * in other DAGs,
        the live versions, when `written` is the dataset's current version. A building
        version gets tasks only for the jobs it rebuilds; they are 'buffered' (held until
        cutover) unless the event comes from the rebuild itself."""
        return self._run(
            _Q.subscribers,
            {
                "producer_dag": producer_dag,
                "producer_version": producer_version,
                "dataset_uuid": dataset_uuid,
                "org_id": org_id,
                "written": written,
            },
        )

    def source_jobs(self, *, dag_id: UUID) -> Cursor[Row]:
        """The live versions of a DAG a trigger starts: the active one, and a building one for the
        source jobs it rebuilds (held until cutover)."""
        return self._run(_Q.source_jobs, {"dag_id": dag_id})

    def insert_fire(
        self,
        *,
        run_id: UUID | None,
        dag_id: UUID,
        dag_version: int,
        trigger: str,
        kind: str,
        fire_key: str,
        config: Jsonb,
        fired_by: UUID | None,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_fire,
            {
                "run_id": run_id,
                "dag_id": dag_id,
                "dag_version": dag_version,
                "trigger": trigger,
                "kind": kind,
                "fire_key": fire_key,
                "config": config,
                "fired_by": fired_by,
            },
        )

    def fire_by_key(self, *, dag_id: UUID, trigger: str, fire_key: str) -> Cursor[Row]:
        return self._run(
            _Q.fire_by_key, {"dag_id": dag_id, "trigger": trigger, "fire_key": fire_key}
        )

    def run_tree(self, *, run_id: UUID | None, first_day: int, last_day: int) -> Cursor[Row]:
        """Lineage of a run: roots of the run, then every task whose parent is in the tree. Every
        scan prunes to the run's days (`first_day`..`last_day`: run_fire's), each step also
        to the parent's start_day onwards."""
        return self._run(
            _Q.run_tree, {"run_id": run_id, "first_day": first_day, "last_day": last_day}
        )

    def list_runs(
        self,
        *,
        org_id: UUID,
        dag_ids: list[UUID],
        dag: str | None,
        limit: int,
    ) -> Cursor[Row]:
        """Only runs of `dag_ids`: the DAGs the caller may see (decided by the control plane)."""
        return self._run(
            _Q.list_runs, {"org_id": org_id, "dag_ids": dag_ids, "dag": dag, "limit": limit}
        )

    def run_fire(self, *, run_id: UUID | None) -> Cursor[Row]:
        return self._run(_Q.run_fire, {"run_id": run_id})

    def cron_candidates(self) -> Cursor[Row]:
        return self._run(_Q.cron_candidates)

    def cron_lock(self, *, dag_id: UUID, trigger: str) -> Cursor[Row]:
        """Whoever holds the row fires the tick; a second scheduler skips it rather than wait."""
        return self._run(_Q.cron_lock, {"dag_id": dag_id, "trigger": trigger})

    def cron_lock_wait(self, *, dag_id: UUID, trigger: str) -> Cursor[Row]:
        """An outside scheduler's tick waits for the row: skipping could drop a tick."""
        return self._run(_Q.cron_lock_wait, {"dag_id": dag_id, "trigger": trigger})

    def dag_in_org(self, *, org: str, dag: str) -> Cursor[Row]:
        """A DAG by its org's name and its own (a caller with no user, such as a schedule)."""
        return self._run(_Q.dag_in_org, {"org": org, "dag": dag})

    def cron_advance(self, *, fire_at: datetime, dag_id: UUID, trigger: str) -> Cursor[Row]:
        return self._run(
            _Q.cron_advance, {"fire_at": fire_at, "dag_id": dag_id, "trigger": trigger}
        )

    def run_version_state(self, *, dag_id: UUID, version: int) -> Cursor[Row]:
        """What a run's retry checks: its DAG paused, and the state of the version it fired."""
        return self._run(_Q.run_version_state, {"dag_id": dag_id, "version": version})
