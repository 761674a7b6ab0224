"""Users and API keys of an org, managed by its admins (docs/identity.md): `trace users` and
`trace keys`, `/v1/users` and `/v1/keys` call this.

Trace has no platform-wide admin: every admin is an org's, and manages that org's users and
keys alone (another org's keys and users answer as absent). A key is shown once, when it is
made (create, rotate, users add); only its SHA-256 digest is stored. Changes to an org's users
and keys are serialised by a lock on the org's row, so the org always keeps an admin (the last
one cannot be removed or demoted) and an admin key that never expires (the last such key of its
admins cannot be revoked, rotated into an expiring one, nor its holder removed or demoted)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool

from trace_platform import audit
from trace_platform.errors import Conflict, Invalid, NotFound
from trace_platform.identity import (
    Actor,
    ensure_user,
    issue_key,
    require_admin,
    set_roles,
)
from trace_platform.store.identity import IdentityStore

USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$")
MAX_KEY_NAME = 100
MAX_GRACE_SECONDS = 3600  # a rotated key's overlap with its successor, at most
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# Longer is "never" (omit the expiry); a bound also keeps the arithmetic inside datetime's range.
MAX_KEY_LIFETIME = timedelta(days=100 * 366)


def parse_duration(text: str) -> timedelta:
    """`90`, `90s`, `15m`, `12h`, `30d`, `2w`."""
    m = _DURATION.fullmatch(text)
    if m is None or float(m[1]) <= 0:
        raise Invalid(
            f"expiry {text!r} is not a positive duration like 3600, 90s, 15m, 12h, 30d or 2w"
        )
    seconds = float(m[1]) * _UNIT[m[2]]
    if seconds > MAX_KEY_LIFETIME.total_seconds():
        raise Invalid(_too_long(text))
    return timedelta(seconds=seconds)


def _too_long(given: object) -> str:
    return (
        f"expires_in {given} is longer than {MAX_KEY_LIFETIME.days} days; "
        "for a key that never expires give no expiry"
    )


def expiry(
    expires_in: timedelta | None, expires_at: datetime | None, now: datetime | None = None
) -> datetime | None:
    """When a new key stops: after `expires_in`, at `expires_at` (with a time zone, in the
    future), or never. Both at once are refused."""
    now = now or datetime.now(UTC)
    if expires_in is not None and expires_at is not None:
        raise Invalid("give an expiry as expires_in or expires_at, not both")
    if expires_in is not None:
        if expires_in <= timedelta(0):
            raise Invalid("expires_in must be a positive duration")
        if expires_in > MAX_KEY_LIFETIME:
            raise Invalid(_too_long(f"{expires_in.total_seconds():g}s"), fields=["expires_in"])
        return now + expires_in
    if expires_at is not None:
        if expires_at.tzinfo is None:
            raise Invalid(f"expires_at {expires_at.isoformat()} needs a time zone (e.g. Z)")
        if expires_at <= now:
            raise Invalid(f"expires_at {expires_at.isoformat()} is not in the future")
    return expires_at


def _check_user_name(name: str) -> None:
    if not USER_NAME.fullmatch(name):
        raise Invalid(f"user name {name[:200]!r} must match {USER_NAME.pattern}")
    # The audit log names the platform's own actions so; a user so named would pass for it.
    if name.lower() in audit.PLATFORM_ACTORS:
        raise Invalid(f"user name {name!r} is reserved: the audit log's name for the platform")


def _check_key_name(name: str | None) -> None:
    if name is not None and (
        not name.strip() or len(name) > MAX_KEY_NAME or any(ord(c) < 32 for c in name)
    ):
        raise Invalid(
            f"a key's name is 1 to {MAX_KEY_NAME} printable characters; {name[:200]!r} is not"
        )


class Identities:
    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    # -- users -----------------------------------------------------------------------------
    def add_user(
        self, actor: Actor, name: str, roles: list[str], is_admin: bool = False
    ) -> dict[str, Any]:
        """Creates the user (or sets an existing or removed one's roles and admin flag) and
        issues a new API key for them, returned once. Demoting the org's last admin is
        refused."""
        require_admin(actor, "manage users")
        _check_user_name(name)
        with self.pool.connection() as conn, conn.transaction():
            store = _locked(conn, actor)
            before = store.user_by_name(org_id=actor.org_id, name=name).fetchone()
            if before is not None and before["is_admin"] and not is_admin:
                _keep_an_admin(store, actor, before["user_id"], f"take admin from '{name}'")
            keys_before = _admin_keys(store, actor)
            user = ensure_user(conn, actor.org_id, name, is_admin=is_admin, roles=roles)
            set_roles(conn, actor, name, roles, is_admin)
            key_id, key = issue_key(conn, user.user_id, created_by=actor.user_id)
            _keep_an_admin_key(store, actor, keys_before, f"take admin from '{name}'")
            was = (
                None
                if before is None
                else {
                    "is_admin": before["is_admin"],
                    "roles": before["roles"],
                    "removed": before["removed_at"] is not None,
                }
            )
            # The new key by its id only: the key itself is shown to the caller once.
            audit.record(
                conn,
                actor,
                "user.add",
                name,
                {"roles": roles, "is_admin": is_admin, "was": was, "key_id": key_id},
            )
        return {"name": name, "roles": roles, "is_admin": is_admin, "api_key": key}

    def list_users(self, actor: Actor, include_removed: bool = False) -> list[dict[str, Any]]:
        require_admin(actor, "list users")
        with self.pool.connection() as conn:
            rows = (
                IdentityStore(conn)
                .list_users(org_id=actor.org_id, include_removed=include_removed)
                .fetchall()
            )
        return [{k: v for k, v in r.items() if k != "user_id"} for r in rows]

    def remove_user(self, actor: Actor, name: str) -> dict[str, Any]:
        """Marks the user removed and revokes every key of theirs at once; what they own
        (DAGs, secrets, history) stays, naming them. The last admin cannot be removed."""
        require_admin(actor, "remove users")
        with self.pool.connection() as conn, conn.transaction():
            store = _locked(conn, actor)
            user = store.user_by_name(org_id=actor.org_id, name=name).fetchone()
            if user is None or user["removed_at"] is not None:
                raise NotFound(f"no user '{name}' in this org")
            if user["is_admin"]:
                _keep_an_admin(store, actor, user["user_id"], f"remove '{name}'")
            keys_before = _admin_keys(store, actor)
            store.remove_user(org_id=actor.org_id, name=name)
            revoked = store.revoke_user_keys(user_id=user["user_id"]).fetchall()
            _keep_an_admin_key(store, actor, keys_before, f"remove '{name}'")
            audit.record(
                conn,
                actor,
                "user.remove",
                name,
                {"revoked_keys": [str(r["key_id"]) for r in revoked][:100]},
            )
        return {"name": name, "revoked_keys": [str(r["key_id"]) for r in revoked]}

    # -- keys ------------------------------------------------------------------------------
    def list_keys(
        self, actor: Actor, user: str | None = None, include_ended: bool = False
    ) -> list[dict[str, Any]]:
        """The org's keys (a user's with `user`): ids, names, prefixes, creators, expiry,
        revocation, last use; never a key or its digest."""
        require_admin(actor, "list API keys")
        with self.pool.connection() as conn:
            return (
                IdentityStore(conn)
                .list_keys(org_id=actor.org_id, user_name=user, include_ended=include_ended)
                .fetchall()
            )

    def create_key(
        self,
        actor: Actor,
        user: str,
        name: str | None = None,
        expires_at: datetime | None = None,
        expires_in: timedelta | None = None,
    ) -> dict[str, Any]:
        """A new key for a user of the org, returned once; see `expiry`."""
        require_admin(actor, "create API keys")
        _check_key_name(name)
        expires_at = expiry(expires_in, expires_at)
        with self.pool.connection() as conn, conn.transaction():
            store = _locked(conn, actor)
            row = store.user_by_name(org_id=actor.org_id, name=user).fetchone()
            if row is None or row["removed_at"] is not None:
                raise NotFound(f"no user '{user}' in this org")
            new = self._new_key(conn, actor, row["user_id"], user, name, expires_at)
            audit.record(
                conn,
                actor,
                "key.create",
                new["key_id"],
                {"user": user, "name": name, "expires_at": expires_at},
            )
            return new

    def revoke_key(self, actor: Actor, key_id: UUID) -> dict[str, Any]:
        """Refused at once by every process (docs/identity.md); a key already revoked is a
        conflict, so is the org's last live admin key."""
        require_admin(actor, "revoke API keys")
        with self.pool.connection() as conn, conn.transaction():
            store = _locked(conn, actor)
            key = _key(store, actor, key_id)
            if key["revoked"]:
                raise Conflict(
                    "already_revoked",
                    f"key {key_id} was already revoked at {key['revoked_at']:%Y-%m-%d %H:%M:%S %Z}",
                )
            before = _admin_keys(store, actor)
            revoked = store.revoke_key(key_id=key_id, grace=0).fetchone()
            _keep_an_admin_key(store, actor, before, f"revoke key {key_id}")
            audit.record(
                conn, actor, "key.revoke", key_id, {"user": key["user_name"], "name": key["name"]}
            )
        assert revoked is not None
        return {
            "key_id": str(key_id),
            "user": key["user_name"],
            "revoked_at": revoked["revoked_at"],
        }

    def rotate_key(
        self,
        actor: Actor,
        key_id: UUID,
        grace_seconds: float = 0,
        expires_at: datetime | None = None,
        expires_in: timedelta | None = None,
    ) -> dict[str, Any]:
        """A new key for the same user and name, and the old one revoked: at once, or after
        `grace_seconds` (at most MAX_GRACE_SECONDS) for its holders to switch. The new key
        expires at `expires_at`, else after the old key's lifetime if it had one."""
        require_admin(actor, "rotate API keys")
        expires_at = expiry(expires_in, expires_at)
        if not 0 <= grace_seconds <= MAX_GRACE_SECONDS:
            raise Invalid(f"grace is 0 to {MAX_GRACE_SECONDS} seconds; {grace_seconds} given")
        with self.pool.connection() as conn, conn.transaction():
            store = _locked(conn, actor)
            old = _key(store, actor, key_id)
            if old["revoked"] or old["expired"] or old["removed_at"] is not None:
                raise Conflict(
                    "key_not_live",
                    f"key {key_id} is no longer live (revoked, expired or its user removed); "
                    "create a new one instead",
                )
            if old["revoked_at"] is not None:
                raise Conflict(
                    "already_rotated",
                    f"key {key_id} is already being rotated (revoked at "
                    f"{old['revoked_at']:%Y-%m-%d %H:%M:%S %Z})",
                )
            if expires_at is None and old["expires_at"] is not None:
                lifetime = min(old["expires_at"] - old["created_at"], MAX_KEY_LIFETIME)
                expires_at = datetime.now(UTC) + lifetime
            before = _admin_keys(store, actor)
            new = self._new_key(
                conn, actor, old["user_id"], old["user_name"], old["name"], expires_at
            )
            revoked = store.revoke_key(key_id=key_id, grace=grace_seconds).fetchone()
            _keep_an_admin_key(store, actor, before, f"rotate key {key_id}")
            audit.record(
                conn,
                actor,
                "key.rotate",
                key_id,
                {
                    "user": old["user_name"],
                    "name": old["name"],
                    "new_key_id": new["key_id"],
                    "grace_seconds": grace_seconds,
                    "expires_at": expires_at,
                },
            )
        assert revoked is not None
        return {**new, "replaces": str(key_id), "old_revoked_at": revoked["revoked_at"]}

    def _new_key(
        self,
        conn: Connection[Any],
        actor: Actor,
        user_id: UUID,
        user: str,
        name: str | None,
        expires_at: datetime | None,
    ) -> dict[str, Any]:
        try:
            with conn.transaction():  # a savepoint: the refusal below leaves nothing stored
                key_id, key = issue_key(
                    conn, user_id, name=name, expires_at=expires_at, created_by=actor.user_id
                )
        except psycopg.errors.CheckViolation as e:
            if e.diag.constraint_name != "api_keys_expiry_after_creation":
                raise
            # This host's clock said the future; the database's (which stores the key) not.
            raise Invalid(
                f"expiry {expires_at} is not after the key's creation by the database's clock",
                fields=["expires_at"],
            ) from None
        return {
            "key_id": str(key_id),
            "user": user,
            "name": name,
            "prefix": key[:8],
            "expires_at": expires_at,
            "api_key": key,
        }


def _locked(conn: Connection[Any], actor: Actor) -> IdentityStore:
    store = IdentityStore(conn)
    store.lock_org(org_id=actor.org_id)
    return store


def _key(store: IdentityStore, actor: Actor, key_id: UUID) -> dict[str, Any]:
    key = store.key_for_update(key_id=key_id, org_id=actor.org_id).fetchone()
    if key is None:
        raise NotFound(f"no API key {key_id} in this org")
    return key


def _keep_an_admin(store: IdentityStore, actor: Actor, user_id: UUID, action: str) -> None:
    left = store.other_admins(org_id=actor.org_id, user_id=user_id).fetchone()
    if left is None or left["n"] == 0:
        raise Conflict(
            "last_admin",
            f"cannot {action}: they are the org's last admin (make another admin first)",
        )


class AdminKeys(NamedTuple):
    """The org's admins' keys: live now, and of those the durable ones (no expiry, no
    revocation set), which alone cannot lapse by themselves."""

    live: int
    durable: int


def _admin_keys(store: IdentityStore, actor: Actor) -> AdminKeys:
    row = store.admin_keys_left(org_id=actor.org_id).fetchone()
    return AdminKeys(int(row["n"]), int(row["durable"])) if row else AdminKeys(0, 0)


def _keep_an_admin_key(store: IdentityStore, actor: Actor, before: AdminKeys, action: str) -> None:
    """Refuses a change that leaves the org's admins without a live key, or without a durable
    one when it had one: an expiring (or rotating) key as the last would lock the org out
    when it lapses, with nobody left to make another (docs/identity.md)."""
    after = _admin_keys(store, actor)
    if before.live > 0 and after.live == 0:
        raise Conflict(
            "last_admin_key",
            f"cannot {action}: no admin of the org would have a live API key left "
            "(create another admin key first)",
        )
    if before.durable > 0 and after.durable == 0:
        raise Conflict(
            "last_admin_key",
            f"cannot {action}: no admin of the org would have an API key that never expires "
            "left, and the org would be locked out once the remaining ones lapse (create "
            "another admin key without an expiry first)",
        )
