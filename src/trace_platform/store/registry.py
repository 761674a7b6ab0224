"""The state store's `registry` calls (`db/sql/registry.sql`)."""

from __future__ import annotations

from uuid import UUID

from psycopg import Cursor
from psycopg.types.json import Jsonb

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("registry")


class RegistryStore(Calls):
    """The calls of `db/sql/registry.sql`, each with its parameters by name and type, on the
    caller's connection (inside the caller's transaction); each returns its cursor."""

    def insert_dag(self, *, dag_id: UUID, org_id: UUID, name: str, owner: UUID) -> Cursor[Row]:
        return self._run(
            _Q.insert_dag, {"dag_id": dag_id, "org_id": org_id, "name": name, "owner": owner}
        )

    def take_dag_ownership(self, *, dag_id: UUID, owner: UUID) -> Cursor[Row]:
        return self._run(_Q.take_dag_ownership, {"dag_id": dag_id, "owner": owner})

    def dag_for_update(self, *, org_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.dag_for_update, {"org_id": org_id, "name": name})

    def dag_by_name(self, *, org_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.dag_by_name, {"org_id": org_id, "name": name})

    def dag_by_id(self, *, dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.dag_by_id, {"dag_id": dag_id})

    def dag_version(self, *, dag_id: UUID, version: int) -> Cursor[Row]:
        return self._run(_Q.dag_version, {"dag_id": dag_id, "version": version})

    def next_version(self, *, dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.next_version, {"dag_id": dag_id})

    def insert_dag_version(
        self,
        *,
        dag_id: UUID,
        version: int,
        spec: Jsonb,
        source_yaml: str,
        checksum: str,
        deployed_by: UUID,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_dag_version,
            {
                "dag_id": dag_id,
                "version": version,
                "spec": spec,
                "source_yaml": source_yaml,
                "checksum": checksum,
                "deployed_by": deployed_by,
            },
        )

    def list_dags(self, *, org_id: UUID) -> Cursor[Row]:
        return self._run(_Q.list_dags, {"org_id": org_id})

    def set_deploy_roles(self, *, roles: list[str], dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.set_deploy_roles, {"roles": roles, "dag_id": dag_id})

    def dataset_by_producer(self, *, dag_id: UUID, job: str, idx: int) -> Cursor[Row]:
        return self._run(_Q.dataset_by_producer, {"dag_id": dag_id, "job": job, "idx": idx})

    def datasets_of_dag(self, *, dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.datasets_of_dag, {"dag_id": dag_id})

    def dataset_by_name(self, *, org_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.dataset_by_name, {"org_id": org_id, "name": name})

    def insert_dataset(
        self,
        *,
        dataset_uuid: UUID,
        org_id: UUID,
        backend: str,
        location: str,
        update_strategy: str,
        unique_key: list[str],
        dag_id: UUID,
        job: str,
        idx: int,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_dataset,
            {
                "dataset_uuid": dataset_uuid,
                "org_id": org_id,
                "backend": backend,
                "location": location,
                "update_strategy": update_strategy,
                "unique_key": unique_key,
                "dag_id": dag_id,
                "job": job,
                "idx": idx,
            },
        )

    def update_dataset_shape(
        self,
        *,
        backend: str,
        location: str,
        update_strategy: str,
        unique_key: list[str],
        dataset_uuid: UUID,
    ) -> Cursor[Row]:
        return self._run(
            _Q.update_dataset_shape,
            {
                "backend": backend,
                "location": location,
                "update_strategy": update_strategy,
                "unique_key": unique_key,
                "dataset_uuid": dataset_uuid,
            },
        )

    def unpublish_dag(self, *, dag_id: UUID) -> Cursor[Row]:
        return self._run(_Q.unpublish_dag, {"dag_id": dag_id})

    def set_hot_window(
        self,
        *,
        of: UUID | None,
        key: str | None,
        dataset_uuid: UUID,
    ) -> Cursor[Row]:
        return self._run(_Q.set_hot_window, {"of": of, "key": key, "dataset_uuid": dataset_uuid})

    def publish(self, *, name: str, dataset_uuid: UUID) -> Cursor[Row]:
        return self._run(_Q.publish, {"name": name, "dataset_uuid": dataset_uuid})

    def insert_dataset_version(
        self,
        *,
        dataset_version: UUID,
        dataset_uuid: UUID,
        dag_id: UUID,
        dag_version: int,
        location: str,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_dataset_version,
            {
                "dataset_version": dataset_version,
                "dataset_uuid": dataset_uuid,
                "dag_id": dag_id,
                "dag_version": dag_version,
                "location": location,
            },
        )

    def insert_subscription(
        self,
        *,
        dag_id: UUID,
        dag_version: int,
        job: str,
        input_index: int,
        dataset_uuid: UUID,
        triggers: Jsonb,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_subscription,
            {
                "dag_id": dag_id,
                "dag_version": dag_version,
                "job": job,
                "input_index": input_index,
                "dataset_uuid": dataset_uuid,
                "triggers": triggers,
            },
        )

    def upsert_slot(
        self,
        *,
        dag_id: UUID,
        pool: str,
        slot_index: int,
        env: Jsonb,
        secrets: Jsonb,
    ) -> Cursor[Row]:
        return self._run(
            _Q.upsert_slot,
            {
                "dag_id": dag_id,
                "pool": pool,
                "slot_index": slot_index,
                "env": env,
                "secrets": secrets,
            },
        )

    def retire_slots(self, *, dag_id: UUID, pools: list[str], idx: int) -> Cursor[Row]:
        """Slots the new version no longer has: held leases stay until released, no new ones."""
        return self._run(_Q.retire_slots, {"dag_id": dag_id, "pools": pools, "idx": idx})

    def init_cron(self, *, dag_id: UUID, trigger: str) -> Cursor[Row]:
        return self._run(_Q.init_cron, {"dag_id": dag_id, "trigger": trigger})

    def list_datasets(self, *, org_id: UUID) -> Cursor[Row]:
        return self._run(_Q.list_datasets, {"org_id": org_id})

    def set_read_roles(self, *, roles: list[str], dataset_uuid: UUID) -> Cursor[Row]:
        return self._run(_Q.set_read_roles, {"roles": roles, "dataset_uuid": dataset_uuid})

    def pinned_versions(self, *, dataset_uuid: UUID) -> Cursor[Row]:
        """Versions of the dataset an unfinished task reads or writes: a purge keeps them (the task
        would find its files gone, or commit to a version that no longer exists)."""
        return self._run(_Q.pinned_versions, {"dataset_uuid": dataset_uuid})

    def versions_of_dataset(self, *, dataset_uuid: UUID) -> Cursor[Row]:
        """Every version of a dataset, newest first, with what still needs it: the served pointer,
        the active and building DAG versions' maps, and the other DAG versions a rollback
        could go back to."""
        return self._run(_Q.versions_of_dataset, {"dataset_uuid": dataset_uuid})

    def purge_locations(self, *, versions: list[UUID]) -> Cursor[Row]:
        """What purged versions point at, each with the backend its version was built with (a
        Postgres version lives in "schema.table", a Parquet one under an object-store
        prefix; the dataset's backend may have changed since). A location some surviving
        commit still names is not retired."""
        return self._run(_Q.purge_locations, {"versions": versions})

    def purge_retire(
        self,
        *,
        org_id: UUID,
        backends: list[str],
        locations: list[str],
    ) -> Cursor[Row]:
        """The collector deletes them once no query pinned before now can still be reading them."""
        return self._run(
            _Q.purge_retire, {"org_id": org_id, "backends": backends, "locations": locations}
        )

    def purge_commits(self, *, versions: list[UUID]) -> Cursor[Row]:
        return self._run(_Q.purge_commits, {"versions": versions})

    def purge_outputs(self, *, versions: list[UUID]) -> Cursor[Row]:
        return self._run(_Q.purge_outputs, {"versions": versions})

    def purge_versions(self, *, versions: list[UUID]) -> Cursor[Row]:
        return self._run(_Q.purge_versions, {"versions": versions})
