"""One unit's rows to Parquet in the object store, streamed in bounded batches (a month can be
millions of rows: never all in memory), one file per org, then read back from the store and
checked against what Postgres held: same row count, same checksum of the keys, same bytes."""

from __future__ import annotations

import gc
import hashlib
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from psycopg.rows import dict_row, tuple_row

from trace_platform.errors import TraceError
from trace_platform.objectstore import ObjectStore, delete_prefix
from trace_platform.retention.units import Unit, month_label
from trace_platform.store.retention import RetentionStore, export_query

# Everything retention writes lives under this prefix: the platform's, beside no org's data
# (org/{org_id}/… is the datasets' layout).
ROOT = "_platform/retention"
ORG_COLUMN = "trace_export_org"
# Postgres types a Parquet column holds as they are; any other (uuid, jsonb, inet, numeric …)
# is exported as its text, which reads back exactly as Postgres printed it.
NATIVE: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "smallint": pa.int16(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "real": pa.float32(),
    "double precision": pa.float64(),
    "text": pa.string(),
    "timestamp with time zone": pa.timestamp("us", tz="UTC"),
    "timestamp without time zone": pa.timestamp("us"),
    "date": pa.date32(),
    "bytea": pa.binary(),
    "text[]": pa.list_(pa.string()),
}
# Key columns whose text Postgres and Python write alike (the checksum is over that text).
KEY_TYPES = frozenset({"smallint", "integer", "bigint", "uuid", "text"})


class RetentionError(TraceError):
    code = "retention"


@dataclass
class ExportedFile:
    key: str
    org_id: UUID | None
    row_count: int
    size: int
    sha256: str


@dataclass
class Export:
    unit: Unit
    export_id: UUID
    prefix: str
    row_count: int
    checksum: int
    at: datetime  # the snapshot the rows were read in
    row_checksum: int  # over whole rows, in that snapshot: what the drop checks against
    files: list[ExportedFile] = field(default_factory=list)


def unit_prefix(unit: Unit) -> str:
    """Where every export of `unit` goes (one folder per try below it)."""
    return f"{ROOT}/{unit.parent}/{month_label(unit.lo)}"


def arrow_type(pg_type: str) -> pa.DataType:
    if pg_type.startswith("character varying"):
        return pa.string()
    return NATIVE.get(pg_type, pa.string())


def key_checksum(keys: Iterator[str]) -> int:
    """The sum of each key's md5's first 60 bits: Postgres's count_and_checksum, in Python."""
    return sum(int(hashlib.md5(k.encode()).hexdigest()[:15], 16) for k in keys)


def _keys_of(batch: pa.RecordBatch) -> Iterator[str]:
    columns = [c.to_pylist() for c in batch.columns]
    for values in zip(*columns, strict=True):
        yield "|".join(str(v) for v in values)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class _Writers:
    """One ParquetWriter per org met so far, each on its own local file."""

    def __init__(self, folder: Path, schema: pa.Schema) -> None:
        self.folder = folder
        self.schema = schema
        self.writers: dict[str | None, pq.ParquetWriter] = {}
        self.rows: dict[str | None, int] = {}

    def path(self, org: str | None) -> Path:
        return self.folder / f"org-{org or 'none'}.parquet"

    def write(self, org: str | None, batch: pa.RecordBatch) -> None:
        if org not in self.writers:
            self.writers[org] = pq.ParquetWriter(self.path(org), self.schema, compression="zstd")
            self.rows[org] = 0
        self.writers[org].write_batch(batch)
        self.rows[org] += batch.num_rows

    def close(self) -> None:
        for w in self.writers.values():
            w.close()


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """The cyclic GC off meanwhile. With a batch of rows alive at once (tens of thousands of
    tuples surviving into the oldest generation), Python ran a full collection about every
    batch, 0.1-0.4 s each on this 2-core machine, freeing nothing: rows, arrays and keys hold
    no cycles, so reference counting frees them all. Any cycle made meanwhile waits for the
    next collection after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@_no_cycle_collection()
def export_unit(
    dsn: str,
    store: ObjectStore,
    unit: Unit,
    *,
    registry: str | None,
    batch_rows: int = 50_000,
    on_count: Callable[[int], None] | None = None,
    on_rows: Callable[[int], None] | None = None,
) -> Export:
    """Exports `unit` (read in one REPEATABLE READ snapshot) under a prefix of its own, reads
    it back and checks it; raises RetentionError (and leaves no file of this try) otherwise.
    `registry`: the same month's task_registry partition, for the org of rows without one.
    `on_count`: given the unit's rows in that snapshot, before any is read; `on_rows`: each
    batch's as it is written."""
    export_id = uuid.uuid4()
    prefix = f"{unit_prefix(unit)}/{export_id}"
    table = unit.relname if unit.is_partition else unit.parent
    with (
        psycopg.connect(dsn, row_factory=dict_row, autocommit=True) as conn,
        tempfile.TemporaryDirectory() as tmp,
    ):
        conn.execute("SET TIME ZONE 'UTC'")
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            rs = RetentionStore(conn)
            columns = rs.columns(table=table).fetchall()
            if not columns:
                raise RetentionError(f"table {table} does not exist")
            key = rs.primary_key(table=unit.parent).fetchall()
            bad = [k["name"] for k in key if k["type"] not in KEY_TYPES]
            if not key or bad:
                raise RetentionError(f"{unit.parent} has no primary key retention can check")
            key_names = [k["name"] for k in key]
            expected = rs.count_and_checksum(
                table=table, key=key_names, status_range=unit.status_range
            )
            if on_count is not None:
                on_count(int(expected["n"]))
            names = [c["name"] for c in columns]
            has_org = "org_id" in names
            query, params = export_query(
                table=table,
                columns=[
                    (c["name"], c["type"] in NATIVE or c["type"].startswith("character"))
                    for c in columns
                ],
                org="org_id" if has_org else None,
                registry=None if has_org or unit.parent == "task_registry" else registry,
                status_range=unit.status_range,
            )
            fields = [pa.field(c["name"], arrow_type(c["type"])) for c in columns]
            if not has_org:  # the history datasets are read per org: say whose each row is
                fields.append(pa.field("org_id", pa.string()))
            schema = pa.schema(fields)
            writers = _Writers(Path(tmp), schema)
            try:
                with conn.cursor(name=f"retention_{export_id.hex}", row_factory=tuple_row) as cur:
                    cur.itersize = batch_rows
                    cur.execute(query, params)
                    while rows := cur.fetchmany(batch_rows):
                        _write(writers, schema, has_org, rows)
                        if on_rows is not None:
                            on_rows(len(rows))
            finally:
                writers.close()
        export = Export(
            unit,
            export_id,
            prefix,
            int(expected["n"]),
            int(expected["checksum"]),
            expected["at"],
            int(expected["row_checksum"]),
        )
        try:
            for org, n in sorted(writers.rows.items(), key=lambda kv: kv[0] or ""):
                path = writers.path(org)
                f = ExportedFile(
                    key=f"{prefix}/{path.name}",
                    org_id=UUID(org) if org else None,
                    row_count=n,
                    size=path.stat().st_size,
                    sha256=_sha256(path),
                )
                store.put_file(f.key, path)
                export.files.append(f)
            read_back(store, export, key_names, Path(tmp))
        except BaseException:
            delete_prefix(store, prefix + "/")
            raise
    return export


def _write(
    writers: _Writers, schema: pa.Schema, has_org: bool, rows: list[tuple[Any, ...]]
) -> None:
    columns = list(zip(*rows, strict=True))
    orgs = pa.array(columns[-1], pa.string())
    values = columns[:-1] if has_org else columns
    arrays = [pa.array(col, f.type) for col, f in zip(values, schema, strict=True)]
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    owners = pc.unique(orgs).to_pylist()
    for org in owners:
        if len(owners) == 1:
            writers.write(org, batch)
            continue
        mask = pc.is_null(orgs) if org is None else pc.fill_null(pc.equal(orgs, org), False)
        writers.write(org, batch.filter(mask))


def read_back(store: ObjectStore, export: Export, key: list[str], tmp: Path) -> None:
    """Every file as the store gives it back: its bytes (sha256), its rows, and the checksum
    of their keys, which together must be exactly what Postgres held."""
    rows = checksum = 0
    for f in export.files:
        path = tmp / f"readback-{uuid.uuid4().hex}.parquet"
        store.get_file(f.key, path)
        if _sha256(path) != f.sha256:
            raise RetentionError(f"{f.key} read back with other bytes than were written")
        pf = pq.ParquetFile(path)
        if pf.metadata.num_rows != f.row_count:
            raise RetentionError(
                f"{f.key} read back with {pf.metadata.num_rows} rows, {f.row_count} written"
            )
        for batch in pf.iter_batches(batch_size=65_536, columns=key):
            rows += batch.num_rows
            checksum += key_checksum(_keys_of(batch))
        path.unlink()
    if (rows, checksum) != (export.row_count, export.checksum):
        raise RetentionError(
            f"the export of {export.unit.relname} read back {rows} rows (checksum {checksum}); "
            f"Postgres held {export.row_count} (checksum {export.checksum})"
        )
