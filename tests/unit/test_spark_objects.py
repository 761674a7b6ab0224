"""`trace_objects`, the Python data source Spark executors read and write the object store
with: driven directly (schema, partitions, read, write, commit, abort) on a local store."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from trace_platform.objectstore.committed import (
    MANIFEST,
    CorruptCommit,
    committed_parquet,
    read_manifest,
)
from trace_platform.objectstore.local import LocalStore
from trace_platform.spark.objects import ClusterStoreMissing, TraceObjects, cluster_store

OUT = "org/o/dataset/d/version/v/range=0000000000-0000000100/t=4b0a3c3e-1f0e-4a51-9d43-0f6f1c1b2a10.1/"
EMPTY_OUT = "org/o/dataset/d/version/v/t=4b0a3c3e-1f0e-4a51-9d43-0f6f1c1b2a10.2/"
ABORT_OUT = "org/o/dataset/d/version/v/t=4b0a3c3e-1f0e-4a51-9d43-0f6f1c1b2a10.3/"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalStore:
    monkeypatch.setenv("TRACE_OBJECT_STORE", "local")
    monkeypatch.setenv("TRACE_OBJECT_STORE_ROOT", str(tmp_path / "objects"))
    s = LocalStore(tmp_path / "objects")
    s.ensure_bucket()
    return s


def put_table(store: LocalStore, key: str, table: pa.Table) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.put(key, buf.getvalue())


def logs(first: int, n: int) -> pa.Table:
    return pa.table(
        {
            "block_number": pa.array(range(first, first + n), pa.uint32()),
            "log_index": pa.array([1] * n, pa.uint8()),
            "big": pa.array([2**64 - 1 - i for i in range(n)], pa.uint64()),
            "data": pa.array([bytes([i % 256]) * 32 for i in range(n)], pa.large_binary()),
            "topic3": pa.array([None] * n, pa.binary()),
        }
    )


def test_reads_every_key_as_spark_would_type_it(store: LocalStore) -> None:
    put_table(store, "in/a.parquet", logs(0, 5))
    put_table(store, "in/b.parquet", logs(5, 3))
    source = TraceObjects({"keys": json.dumps(["in/a.parquet", "in/b.parquet"])})
    schema = source.schema()
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    # As Spark's own Parquet reader maps unsigned integers.
    assert types == {
        "block_number": "bigint",
        "log_index": "smallint",
        "big": "decimal(20,0)",
        "data": "binary",
        "topic3": "binary",
    }
    reader = source.reader(schema)
    parts = reader.partitions()
    assert [p.value for p in parts] == ["in/a.parquet", "in/b.parquet"]
    tables = [pa.Table.from_batches(list(reader.read(p))) for p in parts]
    assert [t.num_rows for t in tables] == [5, 3]
    assert tables[1].column("block_number").to_pylist() == [5, 6, 7]
    assert tables[0].column("big").to_pylist()[0] == 2**64 - 1  # exact past a long


class CountingStore(LocalStore):
    """Counts the bytes read, to show the schema comes from the footer alone."""

    fetched = 0

    def get(self, key: str) -> bytes:
        data = super().get(key)
        self.fetched += len(data)
        return data

    def get_range(self, key: str, start: int, end: int) -> bytes:
        data = super().get_range(key, start, end)
        self.fetched += len(data)
        return data


# A footer under one ranged read, and over it (checked below). Rows: enough that the data
# outweighs the footer several times over; the footer grows with the columns, not the rows
# (4,000 columns by 20,000 rows were a 470 MB file, and 23 s, for the footer 200 rows give).
@pytest.mark.parametrize("columns", [3, 4000])
def test_the_schema_comes_from_the_footer_alone(tmp_path: Path, columns: int) -> None:
    from trace_platform.spark.objects import _TAIL, _read_schema

    rows = {3: 20_000, 4000: 200}[columns]
    store = CountingStore(tmp_path / "objects")
    store.ensure_bucket()
    table = pa.table({f"c{i}": pa.array(range(rows), pa.uint64()) for i in range(columns)})
    put_table(store, "in/wide.parquet", table)
    size = store.list_page("in/wide.parquet").items[0].size
    footer = int.from_bytes(store.get("in/wide.parquet")[-8:-4], "little")
    assert (footer > _TAIL) == (columns > 3) and footer < size / 4, (footer, size)
    store.fetched = 0
    assert _read_schema(store, "in/wide.parquet") == table.schema
    assert store.fetched < size / 2
    store.put("in/not.parquet", b"hello, not parquet")
    with pytest.raises(ValueError, match=r"in/not\.parquet: not a Parquet file"):
        _read_schema(store, "in/not.parquet")


def test_a_file_whose_columns_differ_fails_naming_it(store: LocalStore) -> None:
    put_table(store, "in/a.parquet", logs(0, 2))
    put_table(store, "in/odd.parquet", pa.table({"block_number": pa.array(["x"])}))
    source = TraceObjects({"keys": json.dumps(["in/a.parquet", "in/odd.parquet"])})
    reader = source.reader(source.schema())
    with pytest.raises(ValueError, match=r"in/odd\.parquet"):
        list(reader.read(reader.partitions()[1]))


def test_no_keys_and_a_bad_prefix_are_refused(store: LocalStore) -> None:
    with pytest.raises(ValueError, match="no keys"):
        TraceObjects({}).schema()
    # The commit deletes strays under its prefix: only an attempt's own prefix is accepted.
    for prefix in ("org/o/dataset/d/", "org/o/dataset/d/version/v/", OUT.rstrip("/"), ""):
        with pytest.raises(ValueError, match="not an attempt's output prefix"):
            TraceObjects({"prefix": prefix}).writer(_schema(), False)


def _schema() -> StructType:
    return StructType([StructField("n", LongType(), True)])


def test_write_commits_exactly_the_successful_files(store: LocalStore) -> None:
    writer = TraceObjects({"prefix": OUT}).writer(_schema(), False)
    batch = pa.record_batch({"n": pa.array([1, 2, 3], pa.int64())})
    ok = [writer.write(iter([batch])), writer.write(iter([batch, batch]))]
    empty = writer.write(iter([]))  # a task with no rows writes no file
    assert empty.key is None
    # A failed attempt's file under the prefix: not committed, so deleted by the commit.
    store.put(OUT + "part-00000-99.parquet", b"half a file")
    writer.commit([*ok, empty, None])
    files = read_manifest(store, OUT)
    assert sorted(f["key"] for f in files) == sorted(m.key for m in ok)
    assert sum(f["rows"] for f in files) == 9
    listed = sorted(o.key for o in store.list_page(OUT).items)
    assert listed == sorted([*(m.key for m in ok), OUT + MANIFEST])
    total = sum(pq.read_table(io.BytesIO(store.get(f["key"]))).num_rows for f in files)
    assert total == 9


def test_readers_follow_the_manifest_once_committed(store: LocalStore) -> None:
    writer = TraceObjects({"prefix": OUT}).writer(_schema(), False)
    batch = pa.record_batch({"n": pa.array([1, 2], pa.int64())})
    ok = writer.write(iter([batch]))
    writer.commit([ok])
    # A zombie executor (a task the job gave up on) puts its file after the commit.
    put_table(store, OUT + "part-00001-7.parquet", pa.table({"n": pa.array([666])}))
    assert committed_parquet(store, OUT) == [ok.key]
    assert committed_parquet(store, OUT.rstrip("/")) == [ok.key]
    # Without a manifest (written by the operator host), the listing is the commit.
    put_table(store, EMPTY_OUT + "part-00000.parquet", pa.table({"n": pa.array([1])}))
    assert committed_parquet(store, EMPTY_OUT) == [EMPTY_OUT + "part-00000.parquet"]


@pytest.mark.parametrize(
    "manifest",
    [
        # another dataset's file: a manifest may only narrow its own prefix's listing
        json.dumps({"files": [{"key": "org/o/dataset/other/version/v/part-00000.parquet"}]}),
        json.dumps({"files": [{"key": OUT + "gone.parquet"}]}),
        json.dumps({"files": "everything"}),
        "{not json",
    ],
)
def test_a_forged_or_broken_manifest_is_refused(store: LocalStore, manifest: str) -> None:
    put_table(store, "org/o/dataset/other/version/v/part-00000.parquet", logs(0, 1))
    put_table(store, OUT + "part-00000.parquet", pa.table({"n": pa.array([1])}))
    store.put(OUT + MANIFEST, manifest.encode())
    with pytest.raises(CorruptCommit, match=MANIFEST):
        committed_parquet(store, OUT)


def test_a_write_without_rows_leaves_one_empty_file_with_the_schema(store: LocalStore) -> None:
    writer = TraceObjects({"prefix": EMPTY_OUT}).writer(_schema(), False)
    writer.commit([writer.write(iter([]))])
    [f] = read_manifest(store, EMPTY_OUT)
    table = pq.read_table(io.BytesIO(store.get(f["key"])))
    assert f["rows"] == 0 and table.num_rows == 0 and table.column_names == ["n"]


def test_abort_removes_what_the_tasks_wrote(store: LocalStore) -> None:
    writer = TraceObjects({"prefix": ABORT_OUT}).writer(_schema(), False)
    m = writer.write(iter([pa.record_batch({"n": pa.array([1], pa.int64())})]))
    assert store.exists(m.key)
    writer.abort([m, None])
    assert not store.exists(m.key)


def test_an_unconfigured_cluster_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACE_OBJECT_STORE", raising=False)
    with pytest.raises(ClusterStoreMissing, match="TRACE_OBJECT_STORE"):
        cluster_store()


def test_timestamps_read_and_write_in_utc(store: LocalStore) -> None:
    from pyspark.sql.types import TimestampType

    ts = pa.array([0, 86_400_000], pa.timestamp("ms", tz="America/New_York"))
    put_table(store, "in/ts.parquet", pa.table({"at": ts}))
    source = TraceObjects({"keys": json.dumps(["in/ts.parquet"])})
    schema = source.schema()
    assert schema.fields[0].dataType == TimestampType()
    reader = source.reader(schema)
    [table] = [pa.Table.from_batches(list(reader.read(p))) for p in reader.partitions()]
    assert table.column("at").cast(pa.int64()).to_pylist() == [0, 86_400_000_000]  # us, UTC
    writer = TraceObjects({"prefix": EMPTY_OUT}).writer(schema, False)
    writer.commit([writer.write(iter([]))])  # the empty file keeps the timestamp column
    [f] = read_manifest(store, EMPTY_OUT)
    assert pq.read_table(io.BytesIO(store.get(f["key"]))).schema.field("at").type.tz == "UTC"


def test_a_giant_manifest_is_refused_unread(
    store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared readers (the Query Service) read a manifest whole: one over the limit is refused
    from the listing's size, never loaded."""
    from trace_platform.objectstore import committed

    put_table(store, OUT + "part-00000.parquet", pa.table({"n": pa.array([1])}))
    files = [{"key": OUT + "part-00000.parquet"}] * 50
    store.put(OUT + MANIFEST, json.dumps({"files": files}).encode())
    monkeypatch.setattr(committed, "MAX_MANIFEST_BYTES", 1024)
    monkeypatch.setattr(store, "get", lambda key: pytest.fail(f"read {key}"))
    with pytest.raises(CorruptCommit, match="at most 1024"):
        committed_parquet(store, OUT)


def test_amount_limbs_are_written_without_a_dictionary(store: LocalStore) -> None:
    """As the operators' Spark writer: near-random limbs get no Parquet dictionary; every
    other column (nested ones too) keeps it."""
    from trace_platform.spark.u256 import FIELDS

    limbs = pa.struct([(f, pa.int64()) for f in FIELDS])
    batch = pa.record_batch(
        {
            "block_number": pa.array([1, 1, 2], pa.int64()),
            "value": pa.array([{f: i for f in FIELDS} for i in range(3)], limbs),
            "other": pa.array(
                [{"a": 1, "b": "x"}] * 3, pa.struct([("a", pa.int64()), ("b", pa.string())])
            ),
        }
    )
    schema = StructType([StructField("n", LongType())])  # only the empty-commit path reads it
    msg = TraceObjects({"prefix": OUT}).writer(schema, False).write(iter([batch]))
    meta = pq.ParquetFile(io.BytesIO(store.get(msg.key))).metadata.row_group(0)
    encodings = {
        meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)
    }
    for path, used in encodings.items():
        dictionary = any("DICT" in e for e in used)
        assert dictionary == (not path.startswith("value.")), (path, used)
    assert sorted(p for p in encodings if p.startswith("value.")) == sorted(
        f"value.{f}" for f in FIELDS
    )


def test_list_and_map_columns_keep_their_dictionary(store: LocalStore) -> None:
    """Only the limbs go without a dictionary: a list's or a map's leaves (Parquet names them
    `x.list.element`, `m.key_value.key`) keep it, as they had before and as a struct's do."""
    batch = pa.record_batch(
        {
            "xs": pa.array([["a", "b"]] * 3, pa.list_(pa.string())),
            "m": pa.array([[("k", 1)]] * 3, pa.map_(pa.string(), pa.int64())),
        }
    )
    schema = StructType([StructField("n", LongType())])  # only the empty-commit path reads it
    msg = TraceObjects({"prefix": OUT}).writer(schema, False).write(iter([batch]))
    meta = pq.ParquetFile(io.BytesIO(store.get(msg.key))).metadata.row_group(0)
    for i in range(meta.num_columns):
        col = meta.column(i)
        assert any("DICT" in e for e in col.encodings), (col.path_in_schema, col.encodings)
