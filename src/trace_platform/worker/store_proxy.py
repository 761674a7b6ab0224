"""The object store as operators see it: scoped to their task, served by the trusted wrapper.

The operator host holds no store credentials and cannot read the Lite store's directory. Its
`RemoteStore` asks the wrapper over the host protocol; the wrapper's `ScopedStore` answers only
for the task's pinned inputs (read) and its own outputs (read and write), uploads files only from
the task's scratch directory (opened without following any symlink, and owned by the sandbox
user), and stages downloads into a directory the operator can read but not change.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from trace_platform import layout
from trace_platform.contract import TaskPayload
from trace_platform.objectstore import (
    NoSuchKey,
    ObjectInfo,
    ObjectStore,
    ObjectStoreError,
    Page,
    check_key,
)


class StoreAccessDenied(ObjectStoreError):
    retryable = False  # the task asked for something outside its scope: no retry fixes that


def _prefix(location: str) -> str:
    return location.rstrip("/") + "/"


class ScopedStore:
    """Wrapper side: one per task run."""

    def __init__(
        self,
        store: ObjectStore,
        task: TaskPayload,
        work: Path,
        inbox: Path,
        sandbox_uid: int | None,
    ) -> None:
        self.store = store
        self.work = work
        self.inbox = inbox
        self.uid = sandbox_uid
        outputs = [
            _prefix(o.location) for o in task.outputs if o.location and o.backend != "postgres"
        ]
        # With the task's buffer root: batches for buffered datasets, each attempt its own keys.
        org_id = getattr(task, "org_id", None)  # a partial payload (tests) may have none
        if org_id is not None:
            outputs.append(layout.buffer_root(org_id, task.task_id))
        self.writable = outputs
        self.readable = outputs + [_prefix(i.location) for i in task.inputs if i.location]
        self.task_id, self.attempt = task.task_id, task.attempt
        self._names = itertools.count()
        self.used = False  # set by the wrapper once the host asks anything of it

    def _scope(self, key: str, prefixes: list[str], what: str, *, prefix: bool = False) -> str:
        check_key(key, prefix=prefix)
        if not any(key.startswith(p) for p in prefixes):
            raise StoreAccessDenied(
                f"{what} '{key}' is outside this task's "
                + ("outputs" if prefixes is self.writable else "inputs and outputs")
            )
        return key

    def _own(self, key: str, what: str) -> str:
        """A write or delete: only this attempt's own keys (`layout.attempt_owns`), so no
        attempt touches what another committed, nor anything the Dispatcher would not accept
        as its commit."""
        self._scope(key, self.writable, what)
        if not any(layout.attempt_owns(p, self.task_id, self.attempt, key) for p in self.writable):
            raise StoreAccessDenied(
                f"{what} '{key}' is outside this attempt's own keys (…/t={self.task_id}."
                f"{self.attempt}/ below its output, or a range's or partition's of it)"
            )
        return key

    def _open_upload(self, path: str) -> int:
        """Opens a file under the scratch directory without following a symlink anywhere."""
        rel = Path(os.path.normpath(path))
        try:
            rel = rel.relative_to(self.work)
        except ValueError:
            raise StoreAccessDenied(
                f"uploads come from the task's scratch dir, not {path}"
            ) from None
        parts = rel.parts
        if not parts or any(p in ("..", ".") for p in parts):
            raise StoreAccessDenied(f"bad upload path {path}")
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.work, flags | os.O_DIRECTORY)
        try:
            for part in parts[:-1]:
                nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = nxt
            # O_NONBLOCK: a FIFO or device must not hang the wrapper in open().
            ffd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
        except OSError as e:
            raise StoreAccessDenied(f"cannot upload {path}: {e.strerror}") from None
        finally:
            os.close(fd)
        st = os.fstat(ffd)
        if not stat.S_ISREG(st.st_mode) or (self.uid is not None and st.st_uid != self.uid):
            os.close(ffd)
            raise StoreAccessDenied(f"{path} is not a regular file the task wrote")
        os.set_blocking(ffd, True)
        return ffd

    def _stage(self, key: str) -> Path:
        self._scope(key, self.readable, "read of")
        dest = self.inbox / f"{next(self._names):06d}-{Path(key).name}"
        self.store.get_file(key, dest)
        dest.chmod(0o644)
        return dest

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"ok": True, **self._handle(req)}
        except NoSuchKey as e:
            return {"ok": False, "kind": "no_such_key", "error": str(e)}
        except StoreAccessDenied as e:
            return {"ok": False, "kind": "denied", "error": str(e)}
        except (ObjectStoreError, OSError, KeyError, ValueError) as e:
            return {"ok": False, "kind": "error", "error": f"{type(e).__name__}: {e}"}

    def _handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op, key = req["op"], str(req.get("key", ""))
        if op == "put_file":
            self._own(key, "write of")
            fd = self._open_upload(str(req["path"]))
            try:
                # The file that was checked, not whatever its path names now: /proc/self/fd/N
                # reopens the descriptor's own inode (a swap after the check is moot).
                self.store.put_file(key, Path(f"/proc/self/fd/{fd}"))
            finally:
                os.close(fd)
            return {}
        if op == "delete":
            self.store.delete(self._own(key, "delete of"))
            return {}
        if op == "stage":
            return {"path": str(self._stage(key))}
        if op == "exists":
            return {"exists": self.store.exists(self._scope(key, self.readable, "read of"))}
        if op == "list":
            self._scope(key, self.readable, "listing of", prefix=True)
            page = self.store.list_page(
                key, req.get("token"), min(int(req.get("limit", 1000)), 1000)
            )
            return {
                "items": [[o.key, o.size, o.modified.isoformat()] for o in page.items],
                "next_token": page.next_token,
            }
        raise ValueError(f"unknown store operation {op!r}")


class RemoteStore:
    """Host side: the ObjectStore protocol over the wrapper's ScopedStore."""

    def __init__(self, call: Callable[[dict[str, Any]], dict[str, Any]], workdir: Path) -> None:
        self._call = call
        self.workdir = workdir

    def _ask(self, **req: Any) -> dict[str, Any]:
        reply = self._call(req)
        if reply.get("ok"):
            return reply
        kind, error = reply.get("kind"), reply.get("error", "store error")
        if kind == "no_such_key":
            raise NoSuchKey(error)
        if kind == "denied":
            raise StoreAccessDenied(error)
        raise ObjectStoreError(error)

    def ensure_bucket(self) -> None:
        return None

    def put(self, key: str, data: bytes) -> None:
        tmp = self.workdir / f".put-{uuid.uuid4().hex}"
        tmp.write_bytes(data)
        try:
            self.put_file(key, tmp)
        finally:
            tmp.unlink(missing_ok=True)

    def put_file(self, key: str, path: Path) -> None:
        self._ask(op="put_file", key=key, path=os.path.abspath(path))

    def get(self, key: str) -> bytes:
        return Path(self._ask(op="stage", key=key)["path"]).read_bytes()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with Path(self._ask(op="stage", key=key)["path"]).open("rb") as f:
            f.seek(start)
            return f.read(max(0, end - start))

    def get_file(self, key: str, path: Path) -> None:
        shutil.copyfile(self._ask(op="stage", key=key)["path"], path)

    def exists(self, key: str) -> bool:
        return bool(self._ask(op="exists", key=key)["exists"])

    def delete(self, key: str) -> None:
        self._ask(op="delete", key=key)

    def list_page(self, prefix: str, token: str | None = None, limit: int = 1000) -> Page:
        r = self._ask(op="list", key=prefix, token=token, limit=limit)
        items = [ObjectInfo(k, int(s), datetime.fromisoformat(m)) for k, s, m in r["items"]]
        return Page(items, r["next_token"])

    def uri(self, key: str) -> str:
        raise ObjectStoreError("operators read objects through the store, not by URI")
