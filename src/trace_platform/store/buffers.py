"""The state store's `buffers` calls (`db/sql/buffers.sql`): buffered datasets and their
buffer records."""

from __future__ import annotations

from uuid import UUID

from psycopg import Cursor
from psycopg.types.json import Jsonb

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

_Q = Queries("buffers")


class BufferStore(Calls):
    def buffered_by_name(self, *, org_id: UUID, name: str) -> Cursor[Row]:
        return self._run(_Q.buffered_by_name, {"org_id": org_id, "name": name})

    def buffered_by_uuid(self, *, dataset_uuid: UUID) -> Cursor[Row]:
        return self._run(_Q.buffered_by_uuid, {"dataset_uuid": dataset_uuid})

    def insert_dataset(
        self,
        *,
        dataset_uuid: UUID,
        org_id: UUID,
        name: str,
        location: str,
        unique_key: list[str],
        dag_id: UUID,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_dataset,
            {
                "dataset_uuid": dataset_uuid,
                "org_id": org_id,
                "name": name,
                "location": location,
                "unique_key": unique_key,
                "dag_id": dag_id,
            },
        )

    def insert_version(
        self,
        *,
        dataset_version: UUID,
        dataset_uuid: UUID,
        dag_id: UUID,
        dag_version: int,
        table_name: str,
        unique_key: list[str],
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_version,
            {
                "dataset_version": dataset_version,
                "dataset_uuid": dataset_uuid,
                "dag_id": dag_id,
                "dag_version": dag_version,
                "table_name": table_name,
                "unique_key": unique_key,
            },
        )

    def insert_buffered(
        self,
        *,
        dataset_uuid: UUID,
        org_id: UUID,
        name: str,
        dag_id: UUID,
        columns: Jsonb,
        unique_key: list[str],
        writers: list[str],
        max_rows: int,
        max_bytes: int,
        table_name: str,
        queue_name: str,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_buffered,
            {
                "dataset_uuid": dataset_uuid,
                "org_id": org_id,
                "name": name,
                "dag_id": dag_id,
                "columns": columns,
                "unique_key": unique_key,
                "writers": writers,
                "max_rows": max_rows,
                "max_bytes": max_bytes,
                "table_name": table_name,
                "queue_name": queue_name,
            },
        )

    def update_buffered(
        self, *, dataset_uuid: UUID, writers: list[str], max_rows: int, max_bytes: int
    ) -> Cursor[Row]:
        return self._run(
            _Q.update_buffered,
            {
                "dataset_uuid": dataset_uuid,
                "writers": writers,
                "max_rows": max_rows,
                "max_bytes": max_bytes,
            },
        )

    def insert_record(
        self,
        *,
        record_id: UUID,
        dataset_uuid: UUID,
        org_id: UUID,
        task_id: UUID,
        attempt: int,
        start_day: int,
        dag_id: UUID | None,
        job: str,
        location: str,
        content_type: str,
    ) -> Cursor[Row]:
        return self._run(
            _Q.insert_record,
            {
                "record_id": record_id,
                "dataset_uuid": dataset_uuid,
                "org_id": org_id,
                "task_id": task_id,
                "attempt": attempt,
                "start_day": start_day,
                "dag_id": dag_id,
                "job": job,
                "location": location,
                "content_type": content_type,
            },
        )

    def record_by_location(self, *, dataset_uuid: UUID, location: str) -> Cursor[Row]:
        return self._run(
            _Q.record_by_location, {"dataset_uuid": dataset_uuid, "location": location}
        )

    def record_for_sink(self, *, record_id: UUID) -> Cursor[Row]:
        return self._run(_Q.record_for_sink, {"record_id": record_id})

    def count_sink_attempt(self, *, record_id: UUID) -> Cursor[Row]:
        return self._run(_Q.count_sink_attempt, {"record_id": record_id})

    def mark_loaded(self, *, record_id: UUID, rows_read: int, rows_loaded: int) -> Cursor[Row]:
        return self._run(
            _Q.mark_loaded,
            {"record_id": record_id, "rows_read": rows_read, "rows_loaded": rows_loaded},
        )

    def note_error(self, *, record_id: UUID, error: str) -> Cursor[Row]:
        return self._run(_Q.note_error, {"record_id": record_id, "error": error})

    def mark_dead(self, *, record_id: UUID, error: str) -> Cursor[Row]:
        return self._run(_Q.mark_dead, {"record_id": record_id, "error": error})

    def buffered_datasets(self, *, names: list[str]) -> Cursor[Row]:
        return self._run(_Q.buffered_datasets, {"names": names})

    def list_records(
        self,
        *,
        org_id: UUID,
        dataset: str | None,
        status: str | None,
        limit: int,
        datasets: list[str] | None = None,
    ) -> Cursor[Row]:
        return self._run(
            _Q.list_records,
            {
                "org_id": org_id,
                "datasets": datasets,
                "dataset": dataset,
                "status": status,
                "limit": limit,
            },
        )
