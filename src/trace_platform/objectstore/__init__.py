"""Object stores: one narrow protocol, a `local` directory adapter (Lite default) and an `s3`
adapter (AWS S3, MinIO, any S3-compatible endpoint). Keys are '/'-separated and relative:
`org/{org_id}/dataset/{dataset_uuid}/version/{dataset_version}/…`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from trace_platform.config import ObjectStoreBackend, Settings


class ObjectStoreError(Exception):
    pass


class NoSuchKey(ObjectStoreError, KeyError):
    pass


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: datetime


@dataclass(frozen=True)
class Page:
    items: list[ObjectInfo]
    next_token: str | None  # pass back to get the next page; None at the end


def check_key(key: str, *, prefix: bool = False) -> str:
    """Keys never escape the store: no absolute paths, no '..', no empty segments."""
    if not key and prefix:
        return key
    parts = key.split("/")
    if (
        not key
        or key.startswith("/")
        or any(p in ("", ".", "..") for p in (parts[:-1] if prefix else parts))
        or "\\" in key
        or "\x00" in key
    ):
        raise ObjectStoreError(f"invalid object key {key!r}")
    return key


@runtime_checkable
class ObjectStore(Protocol):
    def ensure_bucket(self) -> None:
        """Create the bucket (or root directory) if it is missing."""

    def put(self, key: str, data: bytes) -> None: ...

    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file; large files go up in parts (multipart)."""

    def get(self, key: str) -> bytes: ...

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object."""

    def get_file(self, key: str, path: Path) -> None: ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Idempotent: deleting a missing key is not an error."""

    def list_page(self, prefix: str, token: str | None = None, limit: int = 1000) -> Page:
        """One page of keys under `prefix`, in key order."""

    def uri(self, key: str) -> str:
        """Where a reader (DuckDB, Spark) finds the object: file:///… or s3://bucket/…"""


def list_all(store: ObjectStore, prefix: str, page_size: int = 1000) -> Iterator[ObjectInfo]:
    token: str | None = None
    while True:
        page = store.list_page(prefix, token, page_size)
        yield from page.items
        if page.next_token is None:
            return
        token = page.next_token


def delete_prefix(store: ObjectStore, prefix: str) -> int:
    keys = [o.key for o in list_all(store, check_key(prefix, prefix=True))]
    for k in keys:
        store.delete(k)
    return len(keys)


def store_env(settings: Settings) -> dict[str, str]:
    """The object-store settings a worker hands to the operators it runs (and nothing else)."""
    env = {
        "TRACE_OBJECT_STORE": settings.object_store.value,
        "TRACE_SPARK_MASTER": settings.spark_master,
    }
    if settings.object_store is ObjectStoreBackend.local:
        assert settings.object_store_root is not None
        env["TRACE_OBJECT_STORE_ROOT"] = str(Path(settings.object_store_root).absolute())
    else:
        env["TRACE_S3_BUCKET"] = settings.s3_bucket
        env["TRACE_S3_REGION"] = settings.s3_region
        if settings.s3_endpoint_url:
            env["TRACE_S3_ENDPOINT_URL"] = settings.s3_endpoint_url
        if settings.s3_access_key_id:
            env["TRACE_S3_ACCESS_KEY_ID"] = settings.s3_access_key_id
        if settings.s3_secret_access_key:
            env["TRACE_S3_SECRET_ACCESS_KEY"] = settings.s3_secret_access_key.get_secret_value()
    return env


def make_store(settings: Settings) -> ObjectStore:
    if settings.object_store is ObjectStoreBackend.s3:
        from trace_platform.objectstore.s3 import S3Store

        return S3Store(
            bucket=settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            access_key_id=settings.s3_access_key_id,
            secret_access_key=(
                settings.s3_secret_access_key.get_secret_value()
                if settings.s3_secret_access_key
                else None
            ),
        )
    from trace_platform.objectstore.local import LocalStore

    assert settings.object_store_root is not None
    return LocalStore(settings.object_store_root)
