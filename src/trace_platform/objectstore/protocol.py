"""The object-store protocol and what every adapter shares: its errors, listings and key rules.
Apart from `trace_platform.objectstore` (which picks an adapter from the settings) so the
adapters can import it while the package imports them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol, runtime_checkable


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
