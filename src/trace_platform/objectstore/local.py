"""A directory as an object store (the Lite default). Writes are atomic (temp file + rename),
so a reader never sees half an object."""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from trace_platform.objectstore.protocol import NoSuchKey, ObjectInfo, Page, check_key


class LocalStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def ensure_bucket(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def _atomic_write(self, key: str, write: object) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)  # type: ignore[operator]
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put(self, key: str, data: bytes) -> None:
        self._atomic_write(key, lambda f: f.write(data))

    def put_file(self, key: str, path: Path) -> None:
        with open(path, "rb") as src:
            self._atomic_write(key, lambda f: shutil.copyfileobj(src, f, 8 * 1024 * 1024))

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise NoSuchKey(key) from None

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(max(0, end - start))
        except FileNotFoundError:
            raise NoSuchKey(key) from None

    def get_file(self, key: str, path: Path) -> None:
        try:
            shutil.copyfile(self._path(key), path)
        except FileNotFoundError:
            raise NoSuchKey(key) from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # Drop directories left empty, up to the root (keeps listings and the tree tidy).
        for parent in path.parents:
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            try:
                parent.rmdir()
            except OSError:
                break

    def list_page(self, prefix: str, token: str | None = None, limit: int = 1000) -> Page:
        check_key(prefix, prefix=True)
        keys: list[str] = []
        # Walk only the directory the prefix points into, then filter by the full prefix.
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if base.is_dir():
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames.sort()
                for name in filenames:
                    if name.startswith(".tmp-"):
                        continue
                    key = str(Path(dirpath, name).relative_to(self.root))
                    if key.startswith(prefix) and (token is None or key > token):
                        keys.append(key)
        keys.sort()
        page = keys[:limit]
        items = []
        for k in page:
            st = self._path(k).stat()
            items.append(ObjectInfo(k, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC)))
        return Page(items, page[-1] if len(keys) > limit else None)

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()
