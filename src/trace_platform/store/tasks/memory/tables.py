"""The in-memory twin's tables and the bits of SQL semantics its calls share: NULL
comparisons, JSONB round trips, constraints (see `memory/__init__.py`)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime
from typing import Any
from uuid import UUID

from trace_platform.store.tasks.protocol import Row

_EPOCH = date(2025, 1, 1)  # trace_start_day's day 0
_TASK_STATUSES = frozenset({"queued", "running", "succeeded", "failed", "canceled", "buffered"})
_OUTCOMES = frozenset(
    {
        "running",
        "succeeded",
        "failed",
        "canceled",
        "lease_expired",
        "timed_out",
        "state_conflict",
        "released",
    }
)
_UNTRIED = ("state_conflict", "released")
_BLOCK_HASH = re.compile(r"0x[0-9a-f]{64}")

# Columns of the queries' SELECT lists and RETURNING clauses, in their order.
_STATUS = (
    "task_id",
    "start_day",
    "status",
    "attempt",
    "lease_token",
    "lease_until",
    "heartbeat_at",
    "started_at",
    "deadline_at",
    "next_attempt_at",
    "cancel_requested",
    "worker_id",
    "last_error",
    "finished_at",
    "updated_at",
    "progress",
    "progress_at",
)
_VIEW_REGISTRY = (
    "task_id",
    "start_day",
    "org_id",
    "dag_id",
    "dag_version",
    "job",
    "operator",
    "runtime",
    "config",
    "parent_task_id",
    "input_event",
    "input_versions",
    "timeout_seconds",
    "max_attempts",
    "created_at",
    "run_id",
    "worker_pool",
    "max_concurrency",
    "outputs",
)
_VIEW_STATUS = (
    "status",
    "attempt",
    "cancel_requested",
    "lease_token",
    "lease_until",
    "heartbeat_at",
    "deadline_at",
    "next_attempt_at",
    "last_error",
    "finished_at",
)
_FOR_UPDATE_REGISTRY = (
    "max_attempts",
    "retry_backoff_seconds",
    "retry_backoff_max_seconds",
    "org_id",
    "outputs",
    "run_id",
    "dag_id",
    "dag_version",
    "job",
    "operator",
)
_ATTEMPT = ("attempt", "worker_id", "started_at", "finished_at", "outcome", "error")
_COMMITTED_READ = (
    "dataset_uuid",
    "dataset_version",
    "scope",
    "range_start",
    "range_end",
    "location",
    "chain_id",
    "first_block_hash",
    "last_block_hash",
    "parent_hash",
)


class ConstraintViolation(ValueError):
    """A write Postgres would refuse (a unique, foreign-key, not-null or check constraint)."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _start_day(ts: datetime) -> int:
    """trace_start_day(ts): days since 2025-01-01 of the UTC date."""
    return (ts.astimezone(UTC).date() - _EPOCH).days


def _jsonb(value: Any) -> Any:
    """A value as a JSONB column keeps it (None: SQL NULL): JSON only, read back as psycopg
    parses it, and never shared with the caller."""
    if value is None:
        return None
    # allow_nan=False: Postgres refuses NaN and Infinity in JSON as well.
    return _jsonb_order(json.loads(json.dumps(value, allow_nan=False)))


def _jsonb_order(value: Any) -> Any:
    """JSONB keeps an object's keys shortest first, then by their bytes (not as written)."""
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: _jsonb_order(value[k]) for k in keys}
    if isinstance(value, list):
        return [_jsonb_order(v) for v in value]
    return value


def _json_text(value: Any) -> str | None:
    """A JSON value as `->>` and `jsonb_each_text` give it: strings unquoted, null as NULL."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _pg_bool(text: str) -> bool:
    """`text::boolean` (Postgres's boolin): true/false, yes/no, on/off, 1/0 or a unique prefix."""
    s = text.strip().lower()
    if s and ("true".startswith(s) or "yes".startswith(s) or s in ("on", "1")):
        return True
    if s and ("false".startswith(s) or "no".startswith(s) or s in ("of", "off", "0")):
        return False
    raise ValueError(f'invalid input syntax for type boolean: "{text}"')


def _lt(a: Any, b: Any) -> bool:
    """`a < b` in a WHERE clause: never true when either side is NULL."""
    return a is not None and b is not None and bool(a < b)


def _eq(a: Any, b: Any) -> bool:
    """`a = b` in a WHERE clause: never true when either side is NULL."""
    return a is not None and b is not None and bool(a == b)


def _coalesce(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _uuid(value: Any) -> UUID:
    """A parameter bound to a uuid column (Postgres parses text, refusing what is not one)."""
    return value if isinstance(value, UUID) else UUID(str(value))


def _limit(rows: list[Row], limit: int | None) -> list[Row]:
    if limit is None:  # LIMIT NULL: all rows
        return rows
    if limit < 0:
        raise ValueError("LIMIT must not be negative")
    return rows[:limit]


def _pick(row: Row, columns: Iterable[str]) -> Row:
    """The columns of a stored row as a fresh dict (nothing shared with the table)."""
    return {c: copy.deepcopy(row[c]) for c in columns}


def _not_null(table: str, row: Row, columns: Iterable[str]) -> None:
    for c in columns:
        if row[c] is None:
            raise ConstraintViolation(f'null value in column "{c}" of relation "{table}"')


def _check_status(status: str) -> None:
    if status not in _TASK_STATUSES:
        raise ConstraintViolation(f"task_status_status_check: status {status!r}")


@dataclass
class _Tables:
    """The rows, keyed by each table's primary (or arbiter) key; dicts keep insertion order,
    the order a sequential scan would meet them in."""

    task_registry: dict[UUID, Row] = field(default_factory=dict)  # task_id is unique
    task_status: dict[UUID, Row] = field(default_factory=dict)
    task_attempts: dict[tuple[UUID, int, int], Row] = field(default_factory=dict)
    task_retries: dict[tuple[UUID, int, int], Row] = field(default_factory=dict)  # + attempt
    events: dict[tuple[int, UUID], Row] = field(default_factory=dict)
    # UNIQUE (start_day, producer_task_id, dataset_uuid, dedupe_key) -> the PK above
    event_keys: dict[tuple[int, UUID, UUID, str], tuple[int, UUID]] = field(default_factory=dict)
    outbox: dict[int, Row] = field(default_factory=dict)
    pool_slots: dict[tuple[UUID, str, int], Row] = field(default_factory=dict)
    operator_state: dict[tuple[UUID, UUID, str, int], Row] = field(default_factory=dict)
    dags: dict[UUID, Row] = field(default_factory=dict)
    datasets: dict[UUID, Row] = field(default_factory=dict)
    dataset_versions: dict[UUID, Row] = field(default_factory=dict)
    dataset_commits: dict[tuple[UUID, str], Row] = field(default_factory=dict)
    retired_locations: list[Row] = field(default_factory=list)


_TABLES = frozenset(f.name for f in fields(_Tables)) - {"event_keys"}
