"""Where the platform puts data: one spelling of every physical name, shared by the deploy that
assigns them, the operators that write under them, the Dispatcher that checks what an attempt
commits, and the collector that deletes only what these shapes describe.

Parquet: `org/{org}/dataset/{dataset}/version/{version}/` is a version's prefix; an attempt
writes a scope under `[range=SSSSSSSSSS-EEEEEEEEEE/ | partition=KEY/]t={task}.{attempt}/`, keys
no other attempt (nor a replay) ever writes. Postgres: `dataset_{dataset hex}.v_{version hex}`,
one table per version."""

from __future__ import annotations

import re
from uuid import UUID

from trace_platform.contract import RangeSpec

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# A partition key spelled into a key: short, no separators, never "." or "..".
_PARTITION = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9_.=-]{1,128}$")
# What the platform makes, and so all the collector may delete (anything below a version's
# prefix is that version's own: attempts' scopes).
PARQUET_VERSION = re.compile(rf"^org/({_UUID})/dataset/({_UUID})/version/({_UUID})/")
POSTGRES_TABLE = re.compile(r"^dataset_([0-9a-f]{32})\.v_([0-9a-f]{32})$")


def dataset_location(org_id: UUID, dataset_uuid: UUID, backend: str) -> str:
    if backend == "postgres":
        return f"dataset_{dataset_uuid.hex}"
    return f"org/{org_id}/dataset/{dataset_uuid}/"


def version_location(org_id: UUID, dataset_uuid: UUID, version: UUID, backend: str) -> str:
    if backend == "postgres":  # schema per dataset, table per version: both UUID-named
        return f"dataset_{dataset_uuid.hex}.v_{version.hex}"
    return f"org/{org_id}/dataset/{dataset_uuid}/version/{version}/"


def range_prefix(location: str, start: int, end: int) -> str:
    return f"{location.rstrip('/')}/range={start:010d}-{end:010d}/"


def partition_prefix(location: str, partition_key: str) -> str:
    if not _PARTITION.fullmatch(partition_key):
        raise ValueError(
            f"partition key {partition_key!r} cannot name files: use at most 128 of "
            "A-Z a-z 0-9 _ . = -"
        )
    return f"{location.rstrip('/')}/partition={partition_key}/"


def attempt_prefix(location: str, task_id: UUID, attempt: int) -> str:
    """Where one attempt writes a scope: keys no other attempt (nor a replay) ever writes."""
    return f"{location.rstrip('/')}/t={task_id}.{attempt}/"


def scope_prefix(
    location: str,
    task_id: UUID,
    attempt: int,
    *,
    rng: RangeSpec | None = None,
    partition_key: str | None = None,
) -> str:
    """The one prefix an attempt may commit for a scope of an output assigned `location`: the
    range's (or partition's) own keys of this attempt; a whole-version scope's directly under
    the version."""
    if rng is not None:
        location = range_prefix(location, rng.start, rng.end)
    elif partition_key is not None and partition_key != "all":
        location = partition_prefix(location, partition_key)
    return attempt_prefix(location, task_id, attempt)


def attempt_owns(location: str, task_id: UUID, attempt: int, key: str) -> bool:
    """Whether object `key` is one attempt `attempt` of `task_id` may write (or delete) for an
    output assigned `location`: below one of its own scope prefixes (`scope_prefix`), never
    the version's root, another scope's keys or another attempt's."""
    root = location.rstrip("/") + "/"
    if not key.startswith(root):
        return False
    own = re.escape(f"t={task_id}.{attempt}/")
    scope = r"(?:range=\d{10}-\d{10}/|partition=(?!\.\.?/)[A-Za-z0-9_.=-]{1,128}/)?"
    return re.match(rf"^{scope}{own}", key[len(root) :]) is not None


def platform_made(backend: str, location: str, org_id: UUID) -> bool:
    """Whether `location` is one the platform itself assigns to a dataset version of `org_id`
    (or lies below one): the only thing the collector may delete."""
    if backend == "postgres":
        return POSTGRES_TABLE.match(location) is not None
    m = PARQUET_VERSION.match(location)
    return (
        m is not None
        and m.group(1) == str(org_id)
        and location.endswith("/")
        and "//" not in location
        and not any(part in (".", "..") for part in location.split("/"))
    )


def buffer_root(org_id: UUID, task_id: UUID) -> str:
    """Where a task's attempts write buffered-dataset batches: each attempt only its own keys
    below it (`attempt_prefix`), which the buffer publish then checks as `attempt_owns`."""
    return f"org/{org_id}/buffers/task={task_id}/"


def buffer_prefix(org_id: UUID, task_id: UUID, attempt: int) -> str:
    return attempt_prefix(buffer_root(org_id, task_id), task_id, attempt)


def buffer_queue(dataset_uuid: UUID) -> str:
    """A buffered dataset's own queue: one backlog (and one sink's share) per dataset."""
    return f"buffer.{dataset_uuid.hex}"
