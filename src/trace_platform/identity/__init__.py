"""Orgs, users with org roles, API keys, and the permission rules of the decisions note."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg import Connection

from trace_platform.contract import LITE_ORG_ID
from trace_platform.errors import Forbidden, Invalid
from trace_platform.store.identity import IdentityStore

LITE_ADMIN = "admin"
KEY_PREFIX = "trc_"
# A key's last_used_at is written when older than this, never on every request.
LAST_USED_EVERY = 300.0


@dataclass(frozen=True)
class Actor:
    user_id: UUID
    org_id: UUID
    name: str
    is_admin: bool
    roles: frozenset[str] = field(default_factory=frozenset)
    # The API key this call came with (None: no key, e.g. Lite's permissive admin); not part
    # of who the actor is.
    key_id: UUID | None = field(default=None, compare=False)

    def has_any(self, roles: list[str] | set[str] | frozenset[str]) -> bool:
        return bool(self.roles & set(roles))


def actor_from_row(row: dict[str, Any]) -> Actor:
    """A user row (user_id, org_id, name, is_admin, roles) as the Actor it acts as."""
    return Actor(
        row["user_id"], row["org_id"], row["name"], row["is_admin"], frozenset(row["roles"])
    )


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_key(
    conn: Connection[Any],
    user_id: UUID,
    *,
    name: str | None = None,
    expires_at: datetime | None = None,
    created_by: UUID | None = None,
) -> str:
    """Returns the key once; only its digest is stored."""
    return issue_key(conn, user_id, name=name, expires_at=expires_at, created_by=created_by)[1]


def issue_key(
    conn: Connection[Any],
    user_id: UUID,
    *,
    name: str | None = None,
    expires_at: datetime | None = None,
    created_by: UUID | None = None,
) -> tuple[UUID, str]:
    """(its key_id, the key): the key is in no log and no row, only its digest is stored."""
    key, key_id = new_key(), uuid.uuid4()
    IdentityStore(conn).insert_key(
        key_id=key_id,
        user_id=user_id,
        key_hash=hash_key(key),
        prefix=key[:8],
        name=name,
        expires_at=expires_at,
        created_by=created_by,
    )
    return key_id, key


@dataclass(frozen=True)
class KeyMatch:
    """A live key's user, and how long the key stays live by itself (revocation or expiry
    already set), from the database's clock: `valid_for` None for no end."""

    actor: Actor
    key_id: UUID
    valid_for: timedelta | None


def lookup_key(conn: Connection[Any], key_hash: str) -> KeyMatch | None:
    """The live key with this digest (not revoked, not expired, its user not removed), noting
    its use at most every LAST_USED_EVERY seconds."""
    store = IdentityStore(conn)
    row = store.authenticate(key_hash=key_hash).fetchone()
    if row is None:
        return None
    last = row["last_used_at"]
    if last is None or (row["now"] - last).total_seconds() > LAST_USED_EVERY:
        store.touch_key(key_id=row["key_id"], every=LAST_USED_EVERY)
    until = row["valid_until"]
    actor = replace(actor_from_row(row), key_id=row["key_id"])
    return KeyMatch(actor, row["key_id"], until - row["now"] if until else None)


def ensure_user(
    conn: Connection[Any],
    org_id: UUID,
    name: str,
    *,
    is_admin: bool = False,
    roles: list[str] | None = None,
) -> Actor:
    IdentityStore(conn).ensure_user(
        user_id=uuid.uuid4(), org_id=org_id, name=name, is_admin=is_admin, roles=roles or []
    )
    row = IdentityStore(conn).user_by_name(org_id=org_id, name=name).fetchone()
    assert row is not None
    return actor_from_row(row)


def bootstrap_lite(conn: Connection[Any]) -> tuple[Actor, str | None]:
    """The Lite org and its admin; returns a new admin key only the first time."""
    IdentityStore(conn).ensure_org(org_id=LITE_ORG_ID, name="lite")
    admin = ensure_user(conn, LITE_ORG_ID, LITE_ADMIN, is_admin=True)
    if IdentityStore(conn).user_has_key(user_id=admin.user_id).fetchone():
        return admin, None
    return admin, create_key(conn, admin.user_id)


def authenticate(conn: Connection[Any], key: str | None) -> Actor | None:
    """The user a key acts as, read from the database (uncached: `identity.actors` caches)."""
    if not key:
        return None
    found = lookup_key(conn, hash_key(key))
    return found.actor if found else None


def lite_admin(conn: Connection[Any]) -> Actor:
    row = IdentityStore(conn).user_by_name(org_id=LITE_ORG_ID, name=LITE_ADMIN).fetchone()
    if row is None:
        admin, _ = bootstrap_lite(conn)
        return admin
    return actor_from_row(row)


def keyless_admin(conn: Connection[Any]) -> Actor | None:
    """Whom a key-less call acts as under permissive auth: the Lite admin, unless removed (an
    admin removing them must stop key-less callers too, not only the keys)."""
    admin = lite_admin(conn)
    row = IdentityStore(conn).user_by_name(org_id=admin.org_id, name=admin.name).fetchone()
    return admin if row is not None and row["removed_at"] is None else None


def set_roles(
    conn: Connection[Any], actor: Actor, name: str, roles: list[str], is_admin: bool
) -> None:
    require_admin(actor, "change users' roles")
    if (
        IdentityStore(conn)
        .set_roles(org_id=actor.org_id, name=name, roles=roles, is_admin=is_admin)
        .fetchone()
        is None
    ):
        raise Invalid(f"no user '{name}' in this org")


def require_admin(actor: Actor, action: str) -> None:
    if not actor.is_admin:
        raise Forbidden(f"only org admins may {action}; '{actor.name}' is not an admin")


def can_deploy(actor: Actor, dag: dict[str, Any]) -> bool:
    """Deploying or triggering a DAG: admins, its owner, and holders of its deploy_roles."""
    return actor.org_id == dag["org_id"] and (
        actor.is_admin
        or dag["owner_user_id"] == actor.user_id
        or actor.has_any(dag["deploy_roles"])
    )


def can_read(actor: Actor, dataset: dict[str, Any], producer: dict[str, Any]) -> bool:
    """Empty read_roles: private to the producing DAG's deployers plus admins."""
    return actor.org_id == dataset["org_id"] and (
        can_deploy(actor, producer) or actor.has_any(dataset["read_roles"])
    )


def can_read_row(actor: Actor, row: dict[str, Any]) -> bool:
    """can_read for a registry row that carries its producing DAG's owner and deploy_roles."""
    return can_read(actor, row, row)
