"""The state store's `rollout` calls (`db/sql/rollout.sql`)."""

from __future__ import annotations

from uuid import UUID

from psycopg import Cursor
from psycopg.types.json import Jsonb

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("rollout")


class RolloutStore(Calls):
    """The calls of `db/sql/rollout.sql`, each with its parameters by name and type, on the
    caller's connection (inside the caller's transaction); each returns its cursor."""

    def lock_dag(self, *, dag_id: UUID) -> Cursor[Row]:
        """Taken exclusive by deploys, cutovers, rollbacks and pauses; event fan-out and trigger
        fires take it shared (dag_tasks.sql), so each event lands wholly before or wholly
        after a change."""
        return self._run(_Q.lock_dag, {"dag_id": dag_id})

    def dag_for_update(self, *, dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.dag_for_update, {"dag_id": dag_id})

    def version_outputs(self, *, dag_id: UUID, version: int) -> Cursor[Row]:
        return self._run(_Q.version_outputs, {"dag_id": dag_id, "version": version})

    def version_jobs(self, *, dag_id: UUID, version: int) -> Cursor[Row]:
        return self._run(_Q.version_jobs, {"dag_id": dag_id, "version": version})

    def insert_version_output(
        self,
        *,
        dag_id: UUID,
        version: int,
        job: str,
        dataset_uuid: UUID,
        dataset_version: UUID,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_version_output,
            {
                "dag_id": dag_id,
                "version": version,
                "job": job,
                "dataset_uuid": dataset_uuid,
                "dataset_version": dataset_version,
            },
        )

    def insert_version_job(
        self,
        *,
        dag_id: UUID,
        version: int,
        job: str,
        since_version: int,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_version_job,
            {"dag_id": dag_id, "version": version, "job": job, "since_version": since_version},
        )

    def insert_dataset_version(
        self,
        *,
        dataset_version: UUID,
        dataset_uuid: UUID,
        dag_id: UUID,
        dag_version: int,
        location: str,
        state: str,
        backend: str,
        update_strategy: str,
        unique_key: list[str],
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_dataset_version,
            {
                "dataset_version": dataset_version,
                "dataset_uuid": dataset_uuid,
                "dag_id": dag_id,
                "dag_version": dag_version,
                "location": location,
                "state": state,
                "backend": backend,
                "update_strategy": update_strategy,
                "unique_key": unique_key,
            },
        )

    def set_version_state(self, *, state: str, dag_id: UUID, version: int) -> Cursor[Row]:
        return self._run(
            _Q.set_version_state, {"state": state, "dag_id": dag_id, "version": version}
        )

    def set_manual_cutover(self, *, manual: bool, dag_id: UUID, version: int) -> Cursor[Row]:
        return self._run(
            _Q.set_manual_cutover, {"manual": manual, "dag_id": dag_id, "version": version}
        )

    def set_building(self, *, version: int, dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.set_building, {"version": version, "dag_id": dag_id})

    def make_active(self, *, version: int, dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.make_active, {"version": version, "dag_id": dag_id})

    def set_paused(self, *, paused: bool, dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.set_paused, {"paused": paused, "dag_id": dag_id})

    def point_current(self, *, dag_id: UUID, version: int) -> Cursor[Row]:
        """Every output of a DAG version becomes current: the pointer swap of a cutover or rollback."""
        return self._run(_Q.point_current, {"dag_id": dag_id, "version": version})

    def complete_versions(self, *, dag_id: UUID, version: int) -> Cursor[Row]:
        return self._run(_Q.complete_versions, {"dag_id": dag_id, "version": version})

    def abandon_versions(self, *, dag_id: UUID, version: int) -> Cursor[Row]:
        return self._run(_Q.abandon_versions, {"dag_id": dag_id, "version": version})

    def release_buffered(self, *, dag_id: UUID, version: int) -> Cursor[Row]:
        """A version's held work becomes claimable (the caller wakes each task)."""
        return self._run(_Q.release_buffered, {"dag_id": dag_id, "version": version})

    def cancel_work(
        self,
        *,
        reason: str,
        dag_id: UUID,
        versions: list[int],
        jobs: list[str] | None,
    ) -> Cursor[Row]:
        """Queued and held work of the given versions (and jobs, if named) ends canceled; running
        attempts are asked to stop (cooperative cancel)."""
        return self._run(
            _Q.cancel_work, {"reason": reason, "dag_id": dag_id, "versions": versions, "jobs": jobs}
        )

    def queued_of_dag(self, *, dag_id: UUID) -> Cursor[Row]:
        """A resumed DAG's waiting tasks, to wake."""
        return self._run(_Q.queued_of_dag, {"dag_id": dag_id})

    def progress(self, *, dag_id: UUID, version: int) -> Cursor[Row]:
        """A DAG version's work per job: how much is done, waiting, held, failed."""
        return self._run(_Q.progress, {"dag_id": dag_id, "version": version})

    def building_dags(self) -> Cursor[Row]:
        """Rebuilds in flight that cut over by themselves."""
        return self._run(_Q.building_dags)

    def replay_events(
        self,
        *,
        dataset_uuid: UUID,
        written: Jsonb,
        check_consumed: bool,
        dag_id: UUID,
        versions: list[UUID],
        job: str,
        target: Jsonb,
    ) -> Cursor[Row]:
        """What a dataset holds at a version, as events: the newest event per scope from the tasks
        that wrote that version, less those a task of `job` writing `target` already
        consumed (tasks of `versions`: the DAG versions sharing the job's lineage, so the
        lookup stays on an index)."""
        return self._run(
            _Q.replay_events,
            {
                "dataset_uuid": dataset_uuid,
                "written": written,
                "check_consumed": check_consumed,
                "dag_id": dag_id,
                "versions": versions,
                "job": job,
                "target": target,
            },
        )

    def replay_fires(
        self,
        *,
        dag_id: UUID,
        check_consumed: bool,
        versions: list[UUID],
        job: str,
        target: Jsonb,
    ) -> Cursor[Row]:
        """The trigger firings a source job replays: every webhook and manual one (each carries its
        own config), and only the latest cron tick (a tick says "run now"; the job's state
        says from where), less those a task of `job` writing `target` already consumed."""
        return self._run(
            _Q.replay_fires,
            {
                "dag_id": dag_id,
                "check_consumed": check_consumed,
                "versions": versions,
                "job": job,
                "target": target,
            },
        )

    def insert_change_run(
        self,
        *,
        run_id: UUID | None,
        dag_id: UUID,
        dag_version: int,
        kind: str,
        fire_key: str,
        config: Jsonb,
        fired_by: UUID | None,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_change_run,
            {
                "run_id": run_id,
                "dag_id": dag_id,
                "dag_version": dag_version,
                "kind": kind,
                "fire_key": fire_key,
                "config": config,
                "fired_by": fired_by,
            },
        )

    def dag_versions(self, *, dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.dag_versions, {"dag_id": dag_id})

    def dataset_status(self, *, dag_id: UUID, version: int) -> Cursor[Row]:
        """Per output of a DAG version: the dataset, its version in the map, that version's state and
        how much it holds, and whether it is current."""
        return self._run(_Q.dataset_status, {"dag_id": dag_id, "version": version})

    def current_of(self, *, datasets: list[UUID]) -> Cursor[Row]:
        return self._run(_Q.current_of, {"datasets": datasets})

    def shared_readers(self, *, datasets: list[UUID], dag_id: UUID) -> Cursor[Row]:
        """Other DAGs' live jobs woken by these datasets: after a swap they re-run over the new
        history."""
        return self._run(_Q.shared_readers, {"datasets": datasets, "dag_id": dag_id})

    def lineage_versions(self, *, dag_id: UUID, job: str, since: int) -> Cursor[Row]:
        """The DAG versions whose job `job` shares the lineage `since` (they write the same outputs)."""
        return self._run(_Q.lineage_versions, {"dag_id": dag_id, "job": job, "since": since})
