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
from trace_platform.objectstore import make_store
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
