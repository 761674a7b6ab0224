"""The object store as a Lambda handler's operator sees it: the function's own store (its IAM
role's credentials), held to the task's scope in the handler's process, by the same rules as a
worker's `ScopedStore` (read: the task's pinned inputs and its outputs; write and delete: only
this attempt's own keys below its assigned outputs and buffer prefix).

The check runs in the same process as the operator, so it keeps an operator from writing
outside its attempt by mistake, not by malice: what bounds the function is its IAM role
(docs/lambda.md), and what lands is only what the Dispatcher accepts of the attempt's claim."""

from __future__ import annotations

from pathlib import Path

from trace_platform.contract import TaskPayload
from trace_platform.objectstore import ObjectStore, ObjectStoreError, Page
from trace_platform.worker.store_proxy import ScopedStore

MAX_PAGE = 1000  # the most keys one listing answers, as a worker's store proxy


class TaskStore(ScopedStore):
    """The ObjectStore protocol over `store`, scoped to `task` (in-process)."""

    def __init__(self, store: ObjectStore, task: TaskPayload, workdir: Path) -> None:
        super().__init__(store, task, workdir, workdir, None)

    def _read(self, key: str) -> str:
        return self._scope(key, self.readable, "read of")

    def ensure_bucket(self) -> None:
        return None

    def put(self, key: str, data: bytes) -> None:
        self.store.put(self._own(key, "write of"), data)

    def put_file(self, key: str, path: Path) -> None:
        self.store.put_file(self._own(key, "write of"), path)

    def get(self, key: str) -> bytes:
        return self.store.get(self._read(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.store.get_range(self._read(key), start, end)

    def get_file(self, key: str, path: Path) -> None:
        self.store.get_file(self._read(key), path)

    def exists(self, key: str) -> bool:
        return self.store.exists(self._read(key))

    def delete(self, key: str) -> None:
        self.store.delete(self._own(key, "delete of"))

    def list_page(self, prefix: str, token: str | None = None, limit: int = 1000) -> Page:
        self._scope(prefix, self.readable, "listing of", prefix=True)
        return self.store.list_page(prefix, token, min(limit, MAX_PAGE))

    def uri(self, key: str) -> str:
        raise ObjectStoreError("operators read objects through the store, not by URI")
