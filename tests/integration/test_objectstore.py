"""Local and s3 adapters pass the same conformance suite; s3 runs against moto's real S3 HTTP
server on 127.0.0.1 (in memory), the stand-in for MinIO/AWS here."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.support.objectstore_conformance import ObjectStoreConformance
from trace_platform.objectstore.local import LocalStore
from trace_platform.objectstore.s3 import S3Store


class TestLocalStore(ObjectStoreConformance):
    @pytest.fixture
    def store(self, tmp_path: Path) -> LocalStore:
        return LocalStore(tmp_path / "objects")


class TestS3Store(ObjectStoreConformance):
    @pytest.fixture
    def store(self, s3_endpoint: str) -> S3Store:
        return S3Store(
            f"b-{uuid.uuid4().hex[:12]}",
            endpoint_url=s3_endpoint,
            access_key_id="test",
            secret_access_key="test",
            # Small parts so the 12 MB test file really goes up in several parts.
            multipart_threshold=5 * 1024 * 1024,
            part_size=5 * 1024 * 1024,
        )


def test_s3_multipart_really_used(s3_endpoint: str, tmp_path: Path) -> None:
    store = S3Store(
        "mp-check",
        endpoint_url=s3_endpoint,
        access_key_id="t",
        secret_access_key="t",
        multipart_threshold=5 * 1024 * 1024,
        part_size=5 * 1024 * 1024,
    )
    store.ensure_bucket()
    src = tmp_path / "f.bin"
    src.write_bytes(b"\x01" * (11 * 1024 * 1024))
    store.put_file("k/f.bin", src)
    etag = store.client.head_object(Bucket="mp-check", Key="k/f.bin")["ETag"]
    assert etag.strip('"').endswith("-3")  # a multipart ETag names its part count


def test_parquet_dataset_through_s3_reads_back_identically(
    s3_endpoint: str, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trace_platform.objectstore import list_all

    store = S3Store(
        "parquet-rt", endpoint_url=s3_endpoint, access_key_id="t", secret_access_key="t"
    )
    store.ensure_bucket()
    prefix = "org/o/dataset/d/version/v/"
    big = 2**255 + 12345  # a uint256 that no float or DECIMAL(38,0) could hold
    parts = []
    for i in range(3):
        t = pa.table(
            {
                "block_number": pa.array(range(i * 1000, (i + 1) * 1000), pa.int64()),
                "value_text": pa.array([str(big + n) for n in range(1000)]),
                "tx_hash": pa.array([bytes([n % 256]) * 32 for n in range(1000)], pa.binary(32)),
            }
        )
        parts.append(t)
        f = tmp_path / f"part-{i}.parquet"
        pq.write_table(t, f)
        store.put_file(f"{prefix}range={i}/part-0.parquet", f)
    back = []
    for o in list_all(store, prefix):
        local = tmp_path / o.key.replace("/", "_")
        store.get_file(o.key, local)
        back.append(pq.read_table(local))
    assert pa.concat_tables(back).equals(pa.concat_tables(parts))
    assert int(pa.concat_tables(back)["value_text"][0].as_py()) == big
