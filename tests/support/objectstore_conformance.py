"""The ObjectStore conformance suite: every adapter (local, s3) passes the same tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trace_platform.objectstore import (
    NoSuchKey,
    ObjectStore,
    ObjectStoreError,
    delete_prefix,
    list_all,
)

VERSION_PREFIX = (
    "org/00000000-0000-0000-0000-000000000001/dataset/6f1c0b2e-7d2a-4c55-9a43-1f0e7f0b9a10/"
    "version/0d9b5e8a-3c1f-4f7a-8b2e-5a6c7d8e9f00/"
)


class ObjectStoreConformance:
    """Subclasses provide a `store` fixture: an empty store whose bucket may not exist yet."""

    def test_bucket_bootstrap_is_idempotent(self, store: ObjectStore) -> None:
        store.ensure_bucket()
        store.ensure_bucket()
        assert list(list_all(store, "")) == []

    def test_put_get_overwrite(self, store: ObjectStore) -> None:
        store.ensure_bucket()
        key = VERSION_PREFIX + "part-0000.parquet"
        store.put(key, b"first")
        assert store.get(key) == b"first"
        store.put(key, b"second, longer")
        assert store.get(key) == b"second, longer"
        assert store.exists(key) and not store.exists(key + ".nope")

    def test_missing_key(self, store: ObjectStore) -> None:
        store.ensure_bucket()
        with pytest.raises(NoSuchKey):
            store.get("no/such/key")
        with pytest.raises(NoSuchKey):
            store.get_range("no/such/key", 0, 10)

    def test_ranged_get(self, store: ObjectStore) -> None:
        store.ensure_bucket()
        store.put("r/obj", bytes(range(100)))
        assert store.get_range("r/obj", 10, 20) == bytes(range(10, 20))
        assert store.get_range("r/obj", 0, 1) == b"\x00"
        assert store.get_range("r/obj", 95, 200) == bytes(range(95, 100))
        assert store.get_range("r/obj", 50, 50) == b""

    def test_delete_is_idempotent(self, store: ObjectStore) -> None:
        store.ensure_bucket()
        store.put("d/x", b"1")
        store.delete("d/x")
        store.delete("d/x")
        assert not store.exists("d/x")

    def test_list_by_prefix_with_pagination(self, store: ObjectStore) -> None:
        store.ensure_bucket()
        keys = sorted(f"{VERSION_PREFIX}part-{i:04d}.parquet" for i in range(25))
        for k in keys:
            store.put(k, k.encode())
        store.put("org/other/file", b"x")
        store.put(VERSION_PREFIX.rstrip("/") + "-sibling/file", b"x")  # same leading chars
        page = store.list_page(VERSION_PREFIX, limit=10)
        assert [o.key for o in page.items] == keys[:10] and page.next_token is not None
        assert [o.key for o in list_all(store, VERSION_PREFIX, page_size=10)] == keys
        assert all(o.size == len(o.key) for o in list_all(store, VERSION_PREFIX, page_size=7))
        assert [o.key for o in list_all(store, VERSION_PREFIX + "part-002")] == keys[20:]
        assert len(list(list_all(store, ""))) == 27
        assert delete_prefix(store, VERSION_PREFIX) == 25
        assert list(list_all(store, VERSION_PREFIX)) == []

    def test_large_file_multipart_round_trip(self, store: ObjectStore, tmp_path: Path) -> None:
        store.ensure_bucket()
        src = tmp_path / "big.bin"
        data = os.urandom(12 * 1024 * 1024 + 123)  # several parts, the last one short
        src.write_bytes(data)
        store.put_file(VERSION_PREFIX + "big.bin", src)
        out = tmp_path / "back.bin"
        store.get_file(VERSION_PREFIX + "big.bin", out)
        assert out.read_bytes() == data
        assert (
            store.get_range(VERSION_PREFIX + "big.bin", 5_000_000, 5_000_010)
            == data[5_000_000:5_000_010]
        )

    @pytest.mark.parametrize("bad", ["", "/etc/passwd", "../escape", "a/../../b", "a//b", "a\\b"])
    def test_keys_cannot_escape(self, store: ObjectStore, bad: str) -> None:
        store.ensure_bucket()
        with pytest.raises(ObjectStoreError, match="invalid object key"):
            store.put(bad, b"x")

    def test_uri(self, store: ObjectStore) -> None:
        uri = store.uri(VERSION_PREFIX + "a.parquet")
        assert uri.endswith(VERSION_PREFIX + "a.parquet")
        assert uri.startswith(("file:///", "s3://"))
