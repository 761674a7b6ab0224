"""The state store's `retention` calls (`db/sql/retention.sql`)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg import Cursor, sql

from trace_platform.db.queries import Queries
from trace_platform.store.calls import Calls, Row

Q = Queries("retention")


class RetentionStore(Calls):
    """The static calls of `db/sql/retention.sql` on the caller's connection (inside the
    caller's transaction); the ones over a named table are composed in retention/."""

    def try_lock(self) -> bool:
        row = self._run(Q.try_lock).fetchone()
        return bool(row and row["locked"])

    def unlock(self) -> None:
        self._run(Q.unlock)

    def hold_off(self) -> bool:
        """No retention run until the caller's transaction ends; False if one is under way."""
        row = self._run(Q.hold_off).fetchone()
        return bool(row and row["free"])

    def partitions(self) -> Cursor[Row]:
        """Every partition of every table range-partitioned by start_day, with its bound."""
        return self._run(Q.partitions)

    def columns(self, *, table: str) -> Cursor[Row]:
        return self._run(Q.columns, {"table": table})

    def primary_key(self, *, table: str) -> Cursor[Row]:
        return self._run(Q.primary_key, {"table": table})

    def live_tasks(self, *, lo: int, hi: int) -> Cursor[Row]:
        return self._run(Q.live_tasks, {"lo": lo, "hi": hi})

    def building_dags(self) -> Cursor[Row]:
        return self._run(Q.building_dags)

    def export_of(self, *, relname: str) -> Cursor[Row]:
        return self._run(Q.export_of, {"relname": relname})

    def record_export(
        self,
        *,
        relname: str,
        parent: str,
        lo: int,
        hi: int,
        export_id: UUID,
        prefix: str,
        row_count: int,
        key_checksum: Decimal | int,
        row_checksum: Decimal | int,
        exported_at: datetime,
    ) -> Cursor[Row]:
        return self._run(
            Q.record_export,
            {
                "relname": relname,
                "parent": parent,
                "lo": lo,
                "hi": hi,
                "export_id": export_id,
                "prefix": prefix,
                "row_count": row_count,
                "key_checksum": Decimal(key_checksum),
                "row_checksum": Decimal(row_checksum),
                "exported_at": exported_at,
            },
        )

    def forget_files(self, *, relname: str) -> Cursor[Row]:
        return self._run(Q.forget_files, {"relname": relname})

    def record_file(
        self,
        *,
        relname: str,
        key: str,
        org_id: UUID | None,
        row_count: int,
        size: int,
        sha256: str,
    ) -> Cursor[Row]:
        return self._run(
            Q.record_file,
            {
                "relname": relname,
                "key": key,
                "org_id": org_id,
                "row_count": row_count,
                "bytes": size,
                "sha256": sha256,
            },
        )

    def files_of(self, *, relname: str) -> Cursor[Row]:
        return self._run(Q.files_of, {"relname": relname})

    def mark_dropped(self, *, relname: str) -> Cursor[Row]:
        return self._run(Q.mark_dropped, {"relname": relname})

    def orgs_and_role(self) -> Cursor[Row]:
        return self._run(Q.orgs_and_role)

    def exports(self) -> Cursor[Row]:
        return self._run(Q.exports)

    def history_files(self, *, parent: str, org_id: UUID) -> Cursor[Row]:
        """The files of one history dataset an org may read: its own rows of every export."""
        return self._run(Q.history_files, {"parent": parent, "org_id": org_id})

    def history_parents(self, *, org_id: UUID) -> Cursor[Row]:
        return self._run(Q.history_parents, {"org_id": org_id})

    def dropped_registry_at(self, *, day: int) -> Cursor[Row]:
        return self._run(Q.dropped_registry_at, {"day": day})

    def dropped_registry_until(self) -> Cursor[Row]:
        return self._run(Q.dropped_registry_until)

    def fence_failed(self, *, lo: int, hi: int) -> Cursor[Row]:
        """The month's failed tasks refuse late reports (their lease tokens cleared)."""
        return self._run(Q.fence_failed, {"lo": lo, "hi": hi})

    def delete_status(
        self, *, ids: list[UUID], lo: int, hi: int, exported_at: datetime
    ) -> Cursor[Row]:
        """A batch of one exported month's task_status rows, finished and unchanged since."""
        return self._run(
            Q.delete_status, {"ids": ids, "lo": lo, "hi": hi, "exported_at": exported_at}
        )

    def finished_status_ids(self, *, lo: int, hi: int, before: datetime, limit: int) -> list[UUID]:
        rows = self._run(
            Q.finished_status_ids, {"lo": lo, "hi": hi, "before": before, "limit": limit}
        ).fetchall()
        return [r["task_id"] for r in rows]

    # -- over a named table (its name composed as an identifier, never as text) ------------
    def count_and_checksum(
        self, *, table: str, key: list[str], status_range: tuple[int, int] | None = None
    ) -> Row:
        """Rows of `table` and the checksum of their `key` columns (see key_text); with
        `status_range`, only the finished rows of those start days (task_status's month)."""
        where, params = _status_where(status_range)
        query = sql.SQL(Q.count_and_checksum).format(
            key=key_text(key), table=sql.Identifier(table), where=where
        )
        row = self.conn.execute(query, params).fetchone()
        assert row is not None
        return row

    def detach(self, *, parent: str, part: str, finalize: bool = False) -> None:
        """DETACH ... CONCURRENTLY (autocommit: it runs no transaction block), or FINALIZE of
        one an interruption left pending."""
        query = sql.SQL(Q.detach_finalize if finalize else Q.detach).format(
            parent=sql.Identifier(parent), part=sql.Identifier(part)
        )
        self.conn.execute(query)

    def drop_table(self, *, part: str) -> None:
        self.conn.execute(sql.SQL(Q.drop_table).format(part=sql.Identifier(part)))


# Finished tasks only: a live one's status row is not history yet.
_FINISHED = ("succeeded", "failed", "canceled")


def _status_where(status_range: tuple[int, int] | None) -> tuple[sql.Composable, dict[str, Any]]:
    if status_range is None:
        return sql.SQL(""), {}
    return (
        sql.SQL(
            "WHERE t.start_day >= %(lo)s AND t.start_day < %(hi)s AND t.status = ANY(%(done)s)"
        ),
        {"lo": status_range[0], "hi": status_range[1], "done": list(_FINISHED)},
    )


def key_text(key: list[str]) -> sql.Composable:
    """A row's key as text, its columns' text joined by '|' (retention/export.py builds the
    same string from the Parquet read back)."""
    return sql.SQL("concat_ws('|', {})").format(
        sql.SQL(", ").join(sql.SQL("t.{}::text").format(sql.Identifier(k)) for k in key)
    )


def export_query(
    *,
    table: str,
    columns: list[tuple[str, bool]],
    org: str | None,
    registry: str | None,
    status_range: tuple[int, int] | None = None,
) -> tuple[sql.Composed, dict[str, Any]]:
    """The SELECT a unit's export streams: each column as is (`True`: a type Parquet holds
    natively) or as its text, plus `org_id` last for the file it goes to: the row's own
    (`org`: the column), else its task's from the same month's `registry` partition."""
    cols = [
        sql.SQL("t.{}").format(sql.Identifier(n))
        if native
        else sql.SQL("t.{}::text AS {}").format(sql.Identifier(n), sql.Identifier(n))
        for n, native in columns
    ]
    join: sql.Composable = sql.SQL("")
    if org is not None:
        owner: sql.Composable = sql.SQL("t.{}").format(sql.Identifier(org))
    elif registry is not None:
        owner = sql.SQL("r.org_id")
        join = sql.SQL(
            "LEFT JOIN {} r ON r.task_id = t.task_id AND r.start_day = t.start_day"
        ).format(sql.Identifier(registry))
    else:
        owner = sql.SQL("NULL::uuid")
    where, params = _status_where(status_range)
    query = sql.SQL(
        "SELECT {cols}, {owner}::text AS trace_export_org FROM {table} t {join} {where}"
    ).format(
        cols=sql.SQL(", ").join(cols),
        owner=owner,
        table=sql.Identifier(table),
        join=join,
        where=where,
    )
    return query, params
