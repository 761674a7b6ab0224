"""The audit log: who did what to which DAG, dataset, secret, name, user or key, and when.

`record` is called by the control plane (control/, registry/names via control, delivery/control,
triggers/cron) inside the action's own transaction, so a row exists exactly when the action
committed: a refused or failed action leaves none (its transaction rolls the row back with
everything else). Every entry point (CLI, HTTP, API Gateway, EventBridge, the scheduler) goes
through that layer, so each records the same way; `via` tells the row which one it was.

Rows never hold a secret's value, an API key or a signing secret: `record` refuses detail
fields by those names, and callers pass names, counts and ids only. Reading is for org admins,
their org only, newest first, bounded by time so Postgres reads only the months asked for
(the table is partitioned by start_day, a month a partition, as the task registry is)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal, get_args
from uuid import UUID

import psycopg
from psycopg import Connection
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from trace_platform.errors import Invalid
from trace_platform.identity import Actor, require_admin
from trace_platform.store.audit import AuditStore

# The closed vocabulary: each action and the kind of thing it names as its target.
ACTIONS: dict[str, str] = {
    "dag.deploy": "dag",
    "dag.diff": "dag",  # a deploy's dry run: what it would change
    "dag.cutover": "dag",
    "dag.rollback": "dag",
    "dag.pause": "dag",
    "dag.resume": "dag",
    "dag.backfill": "dag",
    "dag.trigger": "dag",  # by hand, a webhook, the scheduler or EventBridge
    "dag.deploy_roles": "dag",
    "run.cancel": "run",
    "run.retry": "run",
    "task.create": "task",
    "task.cancel": "task",
    "dataset.read_roles": "dataset",
    "dataset.purge": "dataset",
    "name.grant": "name",
    "name.revoke": "name",
    "name.reclaim": "name",
    "secret.set": "secret",
    "destination.add": "destination",
    "destination.change": "destination",
    "delivery.retry": "delivery",
    "user.add": "user",
    "user.remove": "user",
    "key.create": "key",
    "key.revoke": "key",
    "key.rotate": "key",
    "retention.drop": "month",  # a month of history exported (or not) and dropped, every org's
}
Outcome = Literal["ok", "dry_run", "noop"]
Source = Literal["cli", "http", "webhook", "eventbridge", "scheduler", "system"]
# The platform acting on its own: automatic cutovers, the cron scheduler, EventBridge schedules.
PlatformActor = Literal["system", "scheduler", "eventbridge"]
PLATFORM_ACTORS = frozenset(get_args(PlatformActor))  # no user may be named so

MAX_DETAILS_BYTES = 8 * 1024  # names, counts and ids, not payloads (the table refuses 16 KiB)
MAX_TEXT = 300  # a target, or one string inside details
# Detail fields that could carry a credential: refused outright (a caller's mistake, caught by
# the tests), so no path can log a secret's value or a key by naming it plainly.
_FORBIDDEN_FIELDS = frozenset(
    {"value", "secret", "api_key", "key", "ciphertext", "password", "token", "signing_secret"}
)
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")
_EPOCH = date(2025, 1, 1)  # start_day 0 (migration 0002's trace_start_day)


@dataclass(frozen=True)
class Via:
    source: Source
    request_id: str | None = None


_CLI = Via("cli")  # no entry said otherwise: the CLI calls the control plane in-process
_VIA: ContextVar[Via | None] = ContextVar("trace_audit_via", default=None)


@contextmanager
def via(source: Source, request_id: str | None = None) -> Iterator[None]:
    """Rows recorded inside this block say they came from `source` (the CLI, the default,
    calls the control plane in-process; the HTTP gateway and the Lambda entries say so)."""
    token = _VIA.set(Via(source, clean_request_id(request_id)))
    try:
        yield
    finally:
        _VIA.reset(token)


def clean_request_id(given: str | None) -> str | None:
    """A caller's request id if it is a plain token of at most 128 characters, else none."""
    return given if given is not None and _REQUEST_ID.fullmatch(given) else None


def record(
    conn: Connection[Any],
    actor: Actor | PlatformActor,
    action: str,
    target: str | UUID,
    details: dict[str, Any] | None = None,
    *,
    org_id: UUID | None = None,
    dag: str | None = None,
    outcome: Outcome = "ok",
    source: Source | None = None,
) -> int:
    """Appends one row in the caller's open transaction (it commits or rolls back with the
    action); returns its id. `org_id` is the actor's org for a user and must be given for the
    platform's own actions. A DAG's actions name the DAG as `dag` by themselves. `source`: where
    a platform action came from when not its own schedule (an operator's `trace admin`)."""
    if action not in ACTIONS:
        raise ValueError(f"'{action}' is not an audit action (audit.ACTIONS)")
    if conn.info.transaction_status != TransactionStatus.INTRANS:
        raise RuntimeError("audit.record runs inside the action's transaction, which is not open")
    kind = ACTIONS[action]
    at = _VIA.get() or _CLI
    if isinstance(actor, Actor):
        who: dict[str, Any] = {
            "org_id": actor.org_id,
            "actor_kind": "user",
            "actor_user_id": actor.user_id,
            "actor_name": actor.name,
            "actor_key_id": actor.key_id,
            "source": source or at.source,
        }
    else:
        if org_id is None:
            raise ValueError(f"an action of '{actor}' names the org it concerns")
        who = {
            "org_id": org_id,
            "actor_kind": actor,
            "actor_user_id": None,
            "actor_name": actor,
            "actor_key_id": None,
            "source": source or actor,
        }
    if org_id is not None and org_id != who["org_id"]:
        raise ValueError("a user's action is recorded in the user's own org")
    row = {
        **who,
        "action": action,
        "target_kind": kind,
        "target": _short(str(target)),
        "dag": dag if dag is not None else (str(target) if kind == "dag" else None),
        "outcome": outcome,
        "request_id": at.request_id,
        "details": Jsonb(bounded(details or {})),
    }
    try:
        with conn.transaction():  # a savepoint: a month without its partition is made, below
            return int(AuditStore(conn).insert(**row).fetchone()["id"])  # type: ignore[index]
    except psycopg.errors.CheckViolation as e:
        if "no partition" not in str(e):
            raise
    # Partition upkeep runs in the Dispatcher's reaper; a CLI-only install may act in a month
    # it never reached. The action must not fail for that: make the months, then write.
    AuditStore(conn).ensure_partitions()
    return int(AuditStore(conn).insert(**row).fetchone()["id"])  # type: ignore[index]


def bounded(details: dict[str, Any]) -> dict[str, Any]:
    """`details` checked for credential fields and cut to MAX_DETAILS_BYTES: long strings
    shortened, and if still too large, only its top-level numbers, flags and short strings
    kept, marked `truncated`."""
    _refuse_credentials(details)
    out = _shorten(details)
    if len(json.dumps(out, default=str)) <= MAX_DETAILS_BYTES:
        return out  # type: ignore[no-any-return]
    kept = {k: v for k, v in out.items() if isinstance(v, int | float | bool | str) or v is None}
    kept["truncated"] = True
    if len(json.dumps(kept, default=str)) > MAX_DETAILS_BYTES:
        kept = {"truncated": True}
    return kept


def _refuse_credentials(value: Any) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if str(k).lower() in _FORBIDDEN_FIELDS:
                raise ValueError(f"audit details may not hold a field named '{k}'")
            _refuse_credentials(v)
    elif isinstance(value, list | tuple):
        for v in value:
            _refuse_credentials(v)


def _shorten(value: Any) -> Any:
    if isinstance(value, str):
        return _short(value)
    if isinstance(value, dict):
        return {str(k)[:MAX_TEXT]: _shorten(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_shorten(v) for v in value]
    if isinstance(value, UUID | datetime | date):
        return str(value)
    return value


def _short(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


# -- reading -------------------------------------------------------------------------------
MAX_LIMIT = 1000
_RELATIVE = re.compile(r"^(\d{1,6})([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`--since`: a span back from now (`90s`, `30m`, `24h`, `7d`, `2w`) or an ISO date or
    time (UTC when it names no zone)."""
    now = now or datetime.now(UTC)
    m = _RELATIVE.fullmatch(text.strip())
    try:
        if m:
            return now - timedelta(**{_UNITS[m[2]]: int(m[1])})
        at = datetime.fromisoformat(text.strip())
        # In UTC: a time whose zone puts it outside datetime's range is refused here, not
        # when its partition is computed.
        return at.astimezone(UTC) if at.tzinfo is not None else at.replace(tzinfo=UTC)
    except ValueError:
        raise Invalid(
            f"since {text!r} is neither a span back from now (30m, 24h, 7d, 2w) nor an ISO "
            "date or time (2026-03-01, 2026-03-01T12:00:00Z)",
            fields=["since"],
        ) from None
    except OverflowError:
        raise Invalid(f"since {text!r} is outside the years 1 to 9999", fields=["since"]) from None


def start_day(at: datetime) -> int:
    """The partition key of a time, as trace_start_day computes it in Postgres (UTC day)."""
    days = (at.astimezone(UTC).date() - _EPOCH).days
    return max(-32768, min(32767, days))


def encode_cursor(row: dict[str, Any]) -> str:
    """The next page's `before`: the last row's time (microseconds since the Unix epoch) and id."""
    micros = (row["at"] - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return f"{micros}-{row['id']}"


def decode_cursor(text: str) -> tuple[datetime, int]:
    m = re.fullmatch(r"(-?\d{1,20})-(\d{1,19})", text)
    if m is None:
        raise Invalid(
            f"before {text!r} is not a page cursor (the `next` of a page)", fields=["before"]
        )
    try:
        at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(m[1]))
    except OverflowError:
        raise Invalid(f"before {text!r} is out of range", fields=["before"]) from None
    return at, int(m[2])


def read_bounds(
    since: str | datetime | None, before: str | None, now: datetime | None = None
) -> dict[str, Any]:
    """The time bounds of a read (audit.sql list): constant start_days around them, so the
    months before `since` and after the page (or tomorrow: no row is from the future, give or
    take a clock) are never read, and the exact bounds on `at` and the page cursor."""
    now = now or datetime.now(UTC)
    low = parse_since(since, now) if isinstance(since, str) else since
    before_at, before_id = decode_cursor(before) if before else (None, None)
    high = min(before_at, now + timedelta(days=1)) if before_at else now + timedelta(days=1)
    return {
        "from_day": start_day(low) if low else -32768,
        "to_day": start_day(high),
        "since": low or datetime.min.replace(tzinfo=UTC),
        "before_at": before_at or datetime.max.replace(tzinfo=UTC),
        "before_id": before_id if before_id is not None else 2**63 - 1,
    }


def list_entries(
    conn: Connection[Any],
    actor: Actor,
    *,
    who: str | None = None,
    since: str | datetime | None = None,
    action: str | None = None,
    dag: str | None = None,
    limit: int = 50,
    before: str | None = None,
) -> dict[str, Any]:
    """A page of the actor's org's log, newest first (org admins only): `entries`, and `next`,
    the cursor of the following page (None on the last). `who` is an actor's name (a user, or
    system, scheduler, eventbridge)."""
    require_admin(actor, "read the audit log")
    if not 0 < limit <= MAX_LIMIT:
        raise Invalid(f"limit is 1 to {MAX_LIMIT}; {limit} given", fields=["limit"])
    if action is not None and action not in ACTIONS:
        raise Invalid(
            f"no audit action '{action}'; the actions are {', '.join(sorted(ACTIONS))}",
            fields=["action"],
        )
    params = read_bounds(since, before)
    rows = (
        AuditStore(conn)
        .list(
            limit=limit + 1,
            org_id=actor.org_id,
            actor=who,
            # The platform's names match its own rows only, a user's name a user's rows only.
            actor_kind=None if who is None else who if who in PLATFORM_ACTORS else "user",
            action=action,
            dag=dag,
            **params,
        )
        .fetchall()
    )
    page = rows[:limit]
    return {
        "entries": page,
        "next": encode_cursor(page[-1]) if len(rows) > limit else None,
    }
