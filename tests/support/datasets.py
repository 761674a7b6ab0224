"""Committed dataset data without running a pipeline: Parquet files plus their commit rows
(exactly what an operator's output commit leaves behind), and hot-window loads through the real
sink code."""

from __future__ import annotations

import io
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.dags import admin
from trace_platform.objectstore import list_all, make_store
from trace_platform.operators.hot_window import load_range
from trace_platform.operators.output import range_prefix
from trace_platform.services import Services


def current(services: Services, name: str) -> dict[str, Any]:
    return services.control.show_dataset(admin(services), name)


def version_location(services: Services, version: uuid.UUID) -> str:
    with services.pool.connection() as conn:
        row = conn.execute(
            "SELECT location FROM dataset_versions WHERE dataset_version = %s", [version]
        ).fetchone()
    assert row is not None
    return str(row["location"])


def commit_parquet(
    services: Services,
    name: str,
    table: pa.Table,
    start: int,
    end: int,
    version: uuid.UUID | None = None,
) -> None:
    """One range of a Parquet dataset, committed to its current (or the given) version."""
    ds = current(services, name)
    version = version or ds["current_version"]
    prefix = range_prefix(version_location(services, version), start, end)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    make_store(services.settings).put(f"{prefix}part-00000.parquet", buf.getvalue())
    with services.pool.connection() as conn:
        conn.execute(
            "INSERT INTO dataset_commits (commit_id, dataset_uuid, dataset_version, task_id,"
            " attempt, scope, range_start, range_end, location, row_count)"
            " VALUES (%s, %s, %s, %s, 1, %s, %s, %s, %s, %s)",
            [
                uuid.uuid4(),
                ds["dataset_uuid"],
                version,
                uuid.uuid4(),
                f"range:{start}-{end}",
                start,
                end,
                prefix,
                table.num_rows,
            ],
        )


def load_hot(
    services: Services, name: str, table: pa.Table, start: int, end: int, window: int
) -> int:
    ds = current(services, name)
    location = version_location(services, ds["current_version"])
    return load_range(services.dsn, location, name, table, start, end, window)


def committed_keys(services: Services, name: str) -> list[str]:
    """The object keys a published dataset's current version holds: the files under each of its
    commits' locations (a retry's or replay's superseded files may still sit beside them until
    the collector runs, so a reader follows the commits, never lists the version's prefix)."""
    with services.pool.connection() as conn:
        rows = conn.execute(
            "SELECT dc.location FROM dataset_commits dc "
            "JOIN dataset_current c ON c.dataset_version = dc.dataset_version "
            "JOIN datasets d ON d.dataset_uuid = c.dataset_uuid "
            "WHERE d.dataset_name = %s AND dc.location IS NOT NULL ORDER BY dc.scope",
            [name],
        ).fetchall()
    store = make_store(services.settings)
    return [
        o.key for r in rows for o in list_all(store, r["location"]) if o.key.endswith(".parquet")
    ]
