"""Parquet in the object store, read and written by the Spark executors themselves: how operators
reach their data on a Spark cluster (no S3A jars here, and none needed), with Spark 4's Python
Data Source API (`format("trace_objects")`).

- **Where the store comes from.** The executors (and the cluster's driver, which plans reads and
  commits writes) open the object store from their own environment: `TRACE_OBJECT_STORE` and
  the `TRACE_S3_*` / `TRACE_OBJECT_STORE_ROOT` settings the platform uses (S3 credentials may
  also come from the executors' instance role). The operator host never holds them: it names
  keys and prefixes, which it has already resolved through its scoped store.
- **Reads** take an explicit list of keys (`keys`, JSON): one Spark partition per file, read as
  Arrow record batches. Unsigned Parquet integers map as Spark's own Parquet reader maps them.
- **Writes** go under one prefix (`prefix`): each task writes one file named by its partition
  and task attempt; the job's commit lists the files of the successful attempts in
  `_manifest.json`, deletes any other Parquet under the prefix (a failed or lost attempt's), and
  writes one empty file with the schema when no task wrote a row, so a reader always finds one.
"""

from __future__ import annotations

import io
import json
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from trace_platform.config import Settings
from trace_platform.objectstore import NoSuchKey, ObjectStore, list_all, make_store
from trace_platform.objectstore.committed import MANIFEST

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

NAME = "trace_objects"
ATTEMPT_PREFIX = re.compile(
    r"(^|/)t=[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.[0-9]+/$"
)


class ClusterStoreMissing(RuntimeError):
    pass


def cluster_store() -> ObjectStore:
    """The object store as this Spark process's environment configures it."""
    if not os.environ.get("TRACE_OBJECT_STORE"):
        raise ClusterStoreMissing(
            "the Spark cluster has no object store configured: set TRACE_OBJECT_STORE (and "
            "TRACE_S3_BUCKET, TRACE_S3_ENDPOINT_URL, ... or TRACE_OBJECT_STORE_ROOT) in the "
            "environment of its driver and executors (spark.executorEnv.*)"
        )
    return make_store(Settings())


def _spark_type(t: pa.DataType) -> Any:
    """The Spark type of an Arrow/Parquet column, unsigned integers as Spark's Parquet reader
    maps them (UINT_8 -> short, UINT_16 -> int, UINT_32 -> long, UINT_64 -> decimal(20,0))."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import (
        ArrayType,
        DecimalType,
        IntegerType,
        LongType,
        ShortType,
        StructField,
        StructType,
    )

    unsigned = {8: ShortType(), 16: IntegerType(), 32: LongType(), 64: DecimalType(20, 0)}
    if pa.types.is_unsigned_integer(t):
        return unsigned[t.bit_width]
    if pa.types.is_struct(t):
        return StructType(
            [StructField(f.name, _spark_type(f.type), f.nullable) for f in t]  # type: ignore[attr-defined]
        )
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return ArrayType(_spark_type(t.value_type), True)
    if pa.types.is_large_binary(t):
        t = pa.binary()
    elif pa.types.is_large_string(t):
        t = pa.string()
    return from_arrow_type(t)


def spark_schema(arrow: pa.Schema) -> StructType:
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, _spark_type(f.type), f.nullable) for f in arrow])


_TAIL = 64 * 1024  # one ranged read fetches the footer of any file Trace writes


def _read_schema(store: ObjectStore, key: str) -> pa.Schema:
    """A Parquet object's schema from its footer alone (one or two ranged reads, not the file):
    the cluster's driver plans a read with it."""
    import pyarrow.parquet as pq

    page = store.list_page(key, None, 1)
    if not page.items or page.items[0].key != key:
        raise NoSuchKey(key)
    size = page.items[0].size
    tail = store.get_range(key, max(0, size - _TAIL), size)
    if size < 12 or tail[-4:] != b"PAR1":
        raise ValueError(f"{key}: not a Parquet file")
    footer = int.from_bytes(tail[-8:-4], "little") + 8
    if footer + 4 > size:
        raise ValueError(f"{key}: not a Parquet file (its footer is longer than the file)")
    if footer > len(tail):
        tail = store.get_range(key, size - footer, size)
    # The magic, then the footer: all pyarrow reads to learn the schema.
    return pq.read_schema(io.BytesIO(b"PAR1" + tail[-footer:]))


def _read_table(store: ObjectStore, key: str) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(store.get(key)))


class _Reader(DataSourceReader):
    def __init__(self, keys: list[str], schema: StructType) -> None:
        self.keys = keys
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(k) for k in self.keys]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        target = to_arrow_schema(self.schema, timezone="UTC")
        key = str(partition.value)
        table = _read_table(cluster_store(), key)
        try:
            table = table.select(target.names).cast(target)
        except (KeyError, ValueError, TypeError) as e:  # pyarrow's errors subclass these
            raise ValueError(f"{key}: its columns do not match the first file's: {e}") from None
        yield from table.to_batches()


def dictionary_columns(schema: Any) -> list[str]:
    """The leaf columns written with a Parquet dictionary: all but the amounts' limbs, as the
    operators' Spark writer (`operators.output.parquet_writer`, whose reasons hold here)."""
    import pyarrow as pa

    from trace_platform.spark.words import FIELDS as limbs  # u256's, without its imports

    def leaves(field: Any, path: str) -> list[str]:
        t = field.type
        # A list's and a map's leaves, as Parquet (compliant nested types) names them.
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            return leaves(t.value_field, f"{path}.list.element")
        if pa.types.is_map(t):
            return [
                *leaves(t.key_field, f"{path}.key_value.key"),
                *leaves(t.item_field, f"{path}.key_value.value"),
            ]
        if not pa.types.is_struct(t):
            return [path]
        names = [t.field(i).name for i in range(t.num_fields)]
        if names == limbs and all(pa.types.is_int64(t.field(i).type) for i in range(t.num_fields)):
            return []
        return [x for i in range(t.num_fields) for x in leaves(t.field(i), f"{path}.{names[i]}")]

    return [x for f in schema for x in leaves(f, f.name)]


@dataclass
class _Written(WriterCommitMessage):
    key: str | None
    rows: int
    size: int


class _Writer(DataSourceArrowWriter):
    def __init__(self, prefix: str, schema: StructType) -> None:
        self.prefix = prefix
        self.schema = schema

    def write(self, iterator: Iterator[Any]) -> _Written:
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        buf, writer, rows = io.BytesIO(), None, 0
        for batch in iterator:
            if writer is None:
                writer = pq.ParquetWriter(
                    buf, batch.schema, use_dictionary=dictionary_columns(batch.schema)
                )
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is None or rows == 0:
            return _Written(None, 0, 0)
        writer.close()
        tc = TaskContext.get()
        part, attempt = (
            (tc.partitionId(), tc.taskAttemptId()) if tc is not None else (0, uuid.uuid4().hex)
        )
        key = f"{self.prefix}part-{part:05d}-{attempt}.parquet"
        data = buf.getvalue()
        cluster_store().put(key, data)
        return _Written(key, rows, len(data))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        store = cluster_store()
        files = sorted(
            (m for m in messages if isinstance(m, _Written) and m.key), key=lambda m: str(m.key)
        )
        if not files:  # no rows at all: one empty file, so the schema is still there to read
            buf = io.BytesIO()
            pq.write_table(to_arrow_schema(self.schema, timezone="UTC").empty_table(), buf)
            key = f"{self.prefix}part-00000-empty.parquet"
            store.put(key, buf.getvalue())
            files = [_Written(key, 0, len(buf.getvalue()))]
        keep = {m.key for m in files}
        for obj in list_all(store, self.prefix):
            if obj.key.endswith(".parquet") and obj.key not in keep:
                store.delete(obj.key)
        manifest = {"files": [{"key": m.key, "rows": m.rows, "bytes": m.size} for m in files]}
        store.put(self.prefix + MANIFEST, json.dumps(manifest).encode())

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        store = cluster_store()
        for m in messages:
            if isinstance(m, _Written) and m.key:
                store.delete(m.key)


class TraceObjects(DataSource):
    """`spark.read.format("trace_objects").option("keys", json.dumps([...])).load()` and
    `frame.write.format("trace_objects").mode("append").option("prefix", p).save()`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _keys(self) -> list[str]:
        keys = json.loads(self.options.get("keys", "[]"))
        if not keys:
            raise ValueError("trace_objects: no keys to read")
        return [str(k) for k in keys]

    def schema(self) -> StructType:
        return spark_schema(_read_schema(cluster_store(), self._keys()[0]))

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Reader(self._keys(), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        prefix = self.options.get("prefix", "")
        # Only an attempt's own prefix (output.attempt_prefix): the commit deletes any other
        # Parquet under it, which elsewhere could be committed data.
        if not ATTEMPT_PREFIX.search(prefix):
            raise ValueError(
                f"trace_objects: {prefix!r} is not an attempt's output prefix (…/t=<task>.<n>/)"
            )
        return _Writer(prefix, schema)
