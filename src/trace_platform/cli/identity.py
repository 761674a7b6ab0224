"""`trace users list|remove` and `trace keys list|create|revoke|rotate`: an org's users and API
keys, for its admins (control/identity.py; docs/identity.md). A key is printed once, when made."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.table import Table

from trace_platform.cli.control import console, fail, me, run_op, services, users_app
from trace_platform.cli.safe_text import safe
from trace_platform.control.identity import parse_duration
from trace_platform.errors import TraceError
from trace_platform.lite.bootstrap import key_file

keys_app = typer.Typer(
    help="API keys: list, create, revoke, rotate (org admins).", no_args_is_help=True
)

ExpiresIn = Annotated[
    str | None,
    typer.Option(
        "--expires-in", help="the key stops after this long: 3600, 90s, 15m, 12h, 30d, 2w"
    ),
]
ExpiresAt = Annotated[
    str | None,
    typer.Option(
        "--expires-at",
        help="the key stops at this time: ISO 8601 with a time zone, e.g. 2030-01-01T00:00Z",
    ),
]


def _when(value: datetime | None) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S}" if value else "-"


def _at(expires_at: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(expires_at) if expires_at is not None else None
    except ValueError:
        fail(f"--expires-at {expires_at!r} is not an ISO 8601 time, e.g. 2030-01-01T00:00Z")


def _duration(expires_in: str | None) -> timedelta | None:
    try:
        return parse_duration(expires_in) if expires_in is not None else None
    except TraceError as e:
        fail(e.message)


def _show_key(made: dict[str, Any]) -> None:
    console.print(
        f"key {made['key_id']} for '{safe(made['user'])}'"
        f"{' (' + safe(made['name']) + ')' if made['name'] else ''}, "
        f"expires {_when(made['expires_at']) if made['expires_at'] else 'never'}"
    )
    console.print(f"API key (shown once): {made['api_key']}", highlight=False, soft_wrap=True)


# -- users ---------------------------------------------------------------------------------
@users_app.command("list")
def users_list(
    removed: Annotated[bool, typer.Option(help="also list removed users")] = False,
) -> None:
    """Your org's users: roles, admin, live keys (org admins)."""
    table = Table("user", "admin", "roles", "live keys", "created", "removed")
    for u in run_op(services().control.identity.list_users, me(), removed):
        table.add_row(
            safe(u["name"]),
            "yes" if u["is_admin"] else "",
            safe(", ".join(u["roles"])) or "-",
            str(u["live_keys"]),
            _when(u["created_at"]),
            _when(u["removed_at"]) if u["removed_at"] else "",
        )
    console.print(table)


@users_app.command("remove")
def users_remove(name: str) -> None:
    """Remove a user and revoke all their keys at once (org admins; never the last admin)."""
    gone = run_op(services().control.identity.remove_user, me(), name)
    console.print(f"user '{safe(name)}' removed; {len(gone['revoked_keys'])} key(s) revoked")


# -- keys ----------------------------------------------------------------------------------
@keys_app.command("list")
def keys_list(
    user: Annotated[str | None, typer.Option(help="only this user's keys")] = None,
    all_: Annotated[bool, typer.Option("--all", help="also revoked and expired keys")] = False,
) -> None:
    """Your org's live API keys (never the keys themselves): id, user, name, prefix, expiry,
    last use (to within a few minutes)."""
    table = Table(
        "key id", "user", "name", "prefix", "state", "created", "by", "expires", "last used"
    )
    for k in run_op(services().control.identity.list_keys, me(), user, all_):
        table.add_row(
            str(k["key_id"]),
            safe(k["user_name"]),
            safe(k["name"] or "-"),
            safe(k["prefix"]),
            k["state"],
            _when(k["created_at"]),
            safe(k["created_by"] or "-"),
            _when(k["expires_at"]) if k["expires_at"] else "never",
            _when(k["last_used_at"]),
        )
    console.print(table)


@keys_app.command("create")
def keys_create(
    user: Annotated[str, typer.Argument(help="the user the key acts as")],
    name: Annotated[str | None, typer.Option(help="a label, e.g. where the key is used")] = None,
    expires_in: ExpiresIn = None,
    expires_at: ExpiresAt = None,
) -> None:
    """A new API key for a user of your org, printed once."""
    ids = services().control.identity
    _show_key(run_op(ids.create_key, me(), user, name, _at(expires_at), _duration(expires_in)))


@keys_app.command("revoke")
def keys_revoke(key_id: UUID) -> None:
    """Revoke a key: refused by every Trace process within a second."""
    done = run_op(services().control.identity.revoke_key, me(), key_id)
    console.print(f"key {key_id} of '{safe(done['user'])}' revoked")


@keys_app.command("rotate")
def keys_rotate(
    key_id: UUID,
    grace: Annotated[float, typer.Option(help="seconds the old key still works (0 to 3600)")] = 0,
    expires_in: ExpiresIn = None,
    expires_at: ExpiresAt = None,
) -> None:
    """A new key for the same user and name, printed once; the old one revoked (after
    --grace). Rotating the key this CLI uses from the Lite key file rewrites that file."""
    actor, ids = me(), services().control.identity
    made = run_op(ids.rotate_key, actor, key_id, grace, _at(expires_at), _duration(expires_in))
    _show_key(made)
    console.print(f"old key {key_id} revoked at {_when(made['old_revoked_at'])}")
    s = services().settings
    if actor.key_id == key_id and s.api_key is None and key_file(s).exists():
        key_file(s).write_text(made["api_key"] + "\n")
        console.print(f"the Lite admin key in {key_file(s)} is now the new key")
