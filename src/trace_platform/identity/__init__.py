"""Orgs, users with org roles, API keys, and the permission rules of the decisions note."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import Connection

from trace_platform.contract import LITE_ORG_ID
from trace_platform.errors import Forbidden, Invalid
from trace_platform.store.identity import IdentityStore

LITE_ADMIN = "admin"
KEY_PREFIX = "trc_"


@dataclass(frozen=True)
class Actor:
    user_id: UUID
    org_id: UUID
    name: str
    is_admin: bool
    roles: frozenset[str] = field(default_factory=frozenset)

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


def create_key(conn: Connection[Any], user_id: UUID) -> str:
    """Returns the key once; only its digest is stored."""
    key = new_key()
    IdentityStore(conn).insert_key(
        key_id=uuid.uuid4(), user_id=user_id, key_hash=hash_key(key), prefix=key[:8]
    )
    return key


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
    if not key:
        return None
    row = IdentityStore(conn).authenticate(key_hash=hash_key(key)).fetchone()
    return actor_from_row(row) if row else None


def lite_admin(conn: Connection[Any]) -> Actor:
    row = IdentityStore(conn).user_by_name(org_id=LITE_ORG_ID, name=LITE_ADMIN).fetchone()
    if row is None:
        admin, _ = bootstrap_lite(conn)
        return admin
    return actor_from_row(row)


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
