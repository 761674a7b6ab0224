"""What a committed location holds: the Parquet a reader must read, and nothing else.

A location written by a Spark job through `trace_objects` carries `_manifest.json`, the files
that job committed; the host checked at commit that the prefix held exactly those. After the
commit the manifest is the truth: a zombie executor's late put under the prefix (a task the job
gave up on, still running somewhere) is not in it and is never read. A location without a
manifest (written by the operator host itself) holds only what the host put there before it
committed, so its listing is the truth.

A manifest can only narrow a listing: every key it names must be a Parquet object listed under
its own prefix, so a manifest an operator forged cannot point readers at another dataset's files.
"""

from __future__ import annotations

import json
from typing import Any

from trace_platform.objectstore.protocol import NoSuchKey, ObjectStore, ObjectStoreError, list_all

MANIFEST = "_manifest.json"
# ~100k files' entries: far above any job Trace runs, far below a reader's memory.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024


class CorruptCommit(ObjectStoreError):
    """A committed location whose manifest is unreadable or names files it does not hold."""


def read_manifest(store: ObjectStore, prefix: str) -> list[dict[str, Any]]:
    """The files a `trace_objects` write committed under `prefix`: [{key, rows, bytes}]."""
    try:
        files = json.loads(store.get(prefix + MANIFEST))["files"]
        if not isinstance(files, list) or not all(
            isinstance(f, dict) and isinstance(f.get("key"), str) for f in files
        ):
            raise TypeError("files is not a list of {key, rows, bytes}")
    except NoSuchKey:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptCommit(f"{prefix}{MANIFEST} is not a manifest: {e}") from e
    return files


def committed_parquet(store: ObjectStore, location: str) -> list[str]:
    """The Parquet keys committed at `location`, in key order: its manifest's files where it has
    one, else every Parquet object under it."""
    prefix = location.rstrip("/") + "/"
    objects = list(list_all(store, prefix))
    listed = [o.key for o in objects]
    parquet = [k for k in listed if k.endswith(".parquet")]
    manifest = next((o for o in objects if o.key == prefix + MANIFEST), None)
    if manifest is None:
        return parquet
    if manifest.size > MAX_MANIFEST_BYTES:
        # Read whole by shared readers (the Query Service): an operator's giant one must not
        # be loaded into their memory.
        raise CorruptCommit(
            f"{prefix}{MANIFEST} is {manifest.size} bytes; a manifest is at most "
            f"{MAX_MANIFEST_BYTES}"
        )
    named = sorted({f["key"] for f in read_manifest(store, prefix)})
    missing = sorted(set(named) - set(parquet))
    if missing:
        raise CorruptCommit(
            f"{prefix}{MANIFEST} names {len(missing)} file(s) that are not Parquet committed "
            f"under it, e.g. {missing[0]!r}"
        )
    return named
