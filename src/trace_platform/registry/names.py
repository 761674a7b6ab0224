"""Published names have owners (issue 38): the org's admins. The platform's reserved names (what
the demo DAG publishes, and its saved queries and `trace verify` read) and names an admin
reclaimed are published only by an admin's deploy or a grantee's; an admin grants a name or a
prefix (`team_a_*`) to a user or a role. An org with no grants keeps every other name free for
whoever may deploy (the default), and once it has grants a name no grant covers is the admins'
too (a DAG keeps a name it already publishes).

Reclaiming a name unpublishes it from the DAG that holds it: the dataset keeps its uuid and
data; that DAG's cutovers and rollbacks no longer publish it, and its deploys may not unless
its deployer is an admin or holds a grant."""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

from psycopg import Connection

from trace_platform.errors import Conflict, Forbidden, Invalid, NotFound
from trace_platform.identity import Actor, require_admin
from trace_platform.registry import rollout
from trace_platform.registry.reserved import PLATFORM_DAG, RESERVED
from trace_platform.store.identity import IdentityStore
from trace_platform.store.names import NameStore
from trace_platform.store.registry import RegistryStore

PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,127}\*?$")
ROLE = re.compile(r"^[a-z][a-z0-9_]{0,127}$")


def refusal(conn: Connection[Any], actor: Actor, name: str, *, held: bool) -> str | None:
    """Why `actor` may not publish `name` (None: they may). `held`: their DAG publishes it
    already."""
    if actor.is_admin:
        return None
    store = NameStore(conn)
    grants = store.grants_for(
        org_id=actor.org_id, name=name, user_id=actor.user_id, roles=sorted(actor.roles)
    ).fetchall()
    if grants:
        return None
    if name in RESERVED:
        why = f"a name reserved for the platform's DAG '{PLATFORM_DAG}'"
    elif store.is_reclaimed(org_id=actor.org_id, name=name).fetchone()["any"]:  # type: ignore[index]
        why = "a name an admin reclaimed"
    elif not store.org_has_grants(org_id=actor.org_id).fetchone()["any"]:  # type: ignore[index]
        return None  # no grants in the org: names are free, as before grants existed
    elif held:
        return None  # granted names came after this DAG took it: it keeps it
    else:
        why = "names in this org are granted by its admins, and no grant covers it"
    admins = [r["name"] for r in store.org_admins(org_id=actor.org_id).fetchall()]
    return (
        f"'{actor.name}' may not publish '{name}': {why}; only an org admin "
        f"({', '.join(admins) or 'none'}) may publish it or grant it "
        f"(trace names grant {name} --user {actor.name})"
    )


def check_publish(conn: Connection[Any], actor: Actor, dag_id: UUID, name: str, held: bool) -> None:
    """Raises Forbidden (403) unless `actor` may publish `name` from DAG `dag_id`; when they may,
    a reclaim of it from this DAG is lifted (an admin's or a grantee's deploy publishes it
    again, at cutover too)."""
    why = refusal(conn, actor, name, held=held)
    if why is not None:
        raise Forbidden(why)
    NameStore(conn).delete_reclaim(dag_id=dag_id, name=name)


def reclaimed_from(conn: Connection[Any], dag_id: UUID) -> set[str]:
    """Names an admin took from this DAG: its cutovers and rollbacks skip them."""
    return {r["name"] for r in NameStore(conn).reclaimed_from_dag(dag_id=dag_id).fetchall()}


def _check_pattern(pattern: str) -> None:
    if not PATTERN.fullmatch(pattern):
        raise Invalid(
            f"'{pattern}' is neither a dataset name (^[a-z][a-z0-9_]{{0,127}}$) nor a prefix "
            "ending in '*' (team_a_*)"
        )


def _grantee(
    conn: Connection[Any], actor: Actor, user: str | None, role: str | None
) -> tuple[UUID | None, str | None]:
    if (user is None) == (role is None):
        raise Invalid("give exactly one of a user or a role")
    if role is not None:
        if not ROLE.fullmatch(role):
            raise Invalid(f"role '{role}' must match ^[a-z][a-z0-9_]{{0,127}}$")
        return None, role
    row = IdentityStore(conn).user_by_name(org_id=actor.org_id, name=user).fetchone()
    if row is None:
        raise Invalid(f"no user '{user}' in this org")
    return row["user_id"], None


def grant(
    conn: Connection[Any], actor: Actor, pattern: str, *, user: str | None, role: str | None
) -> dict[str, Any]:
    require_admin(actor, "grant published names")
    _check_pattern(pattern)
    user_id, role = _grantee(conn, actor, user, role)
    NameStore(conn).insert_grant(
        org_id=actor.org_id, pattern=pattern, user_id=user_id, role=role, granted_by=actor.user_id
    )
    return {"pattern": pattern, "user": user, "role": role}


def revoke(
    conn: Connection[Any], actor: Actor, pattern: str, *, user: str | None, role: str | None
) -> dict[str, Any]:
    """The grant goes; what its holder published stays published (`reclaim` takes it back)."""
    require_admin(actor, "revoke published names")
    _check_pattern(pattern)
    user_id, role = _grantee(conn, actor, user, role)
    gone = NameStore(conn).delete_grant(
        org_id=actor.org_id, pattern=pattern, user_id=user_id, role=role
    )
    if gone.fetchone() is None:
        raise NotFound(
            f"no grant of '{pattern}' to {'user ' + str(user) if user else 'role ' + str(role)}"
        )
    return {"pattern": pattern, "user": user, "role": role}


def listing(conn: Connection[Any], actor: Actor) -> dict[str, Any]:
    """The org's grants and reclaimed names, and the platform's reserved names."""
    store = NameStore(conn)
    return {
        "reserved": sorted(RESERVED),
        "platform_dag": PLATFORM_DAG,
        "grants": store.list_grants(org_id=actor.org_id).fetchall(),
        "reclaimed": store.list_reclaims(org_id=actor.org_id).fetchall(),
    }


def reclaim(conn: Connection[Any], actor: Actor, name: str) -> dict[str, Any]:
    """Unpublishes `name` from the DAG that holds it, under that DAG's change lock (so no deploy
    or cutover of it interleaves). Only the name→dataset binding goes."""
    require_admin(actor, "reclaim published names")
    _check_pattern(name)
    if name.endswith("*"):
        raise Invalid("reclaim takes one name, not a prefix")
    row = RegistryStore(conn).dataset_by_name(org_id=actor.org_id, name=name).fetchone()
    if row is None:
        raise NotFound(f"no dataset is published as '{name}'")
    dag = rollout.lock(conn, row["producer_dag_id"])
    gone = NameStore(conn).unpublish_name(org_id=actor.org_id, name=name).fetchone()
    if gone is None or gone["producer_dag_id"] != dag["dag_id"]:
        # It moved between the look-up and the lock: the caller tries again.
        raise Conflict("name_moved", f"'{name}' changed hands meanwhile; try again")
    NameStore(conn).unlink_hot_windows_of(dataset_uuid=gone["dataset_uuid"])
    NameStore(conn).insert_reclaim(
        org_id=actor.org_id, name=name, dag_id=dag["dag_id"], reclaimed_by=actor.user_id
    )
    return {"name": name, "dag": dag["name"], "dataset_uuid": gone["dataset_uuid"]}
