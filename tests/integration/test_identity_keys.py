"""Users and API keys (control/identity.py, /v1/users, /v1/keys, `trace users|keys`) and the
API key cache kept true across processes by LISTEN/NOTIFY (identity/actors.py,
db/invalidation.py): two API servers, each with its own Services (pools and listener), on one
database."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.support.cli import trace as run
from tests.support.servers import admin_key, bearer, secured_api
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.identity import create_key, ensure_user
from trace_platform.services import Services

Apis = tuple[Services, str, Services, str]


@pytest.fixture
def two_apis(settings: Settings, dsn: str) -> Iterator[Apis]:
    """Two API processes' worth of Services and servers on one database, both listening."""
    with ExitStack() as stack:
        a, url_a = stack.enter_context(secured_api(settings, dsn))
        b, url_b = stack.enter_context(secured_api(settings, dsn))
        for svc in (a, b):
            assert svc.listener is not None and svc.listener.wait_live(10)
        yield a, url_a, b, url_b


def _get(url: str, key: str, path: str = "/v1/datasets") -> int:
    return httpx.get(url + path, headers=bearer(key), timeout=10).status_code


def _refused_within(url: str, key: str, seconds: float) -> float:
    """How long until `url` refuses `key` (401), failing past `seconds`."""
    start = time.monotonic()
    wait_for(lambda: _get(url, key) == 401, timeout=seconds, what="the key refused")
    return time.monotonic() - start


def _new_user_key(url: str, admin: str, name: str, **body: object) -> dict[str, object]:
    made = httpx.post(
        url + "/v1/users", headers=bearer(admin), json={"name": name, **body}, timeout=10
    )
    assert made.status_code == 201, made.text
    return made.json()


def _key_id(url: str, admin: str, user: str) -> str:
    keys = httpx.get(url + "/v1/keys", headers=bearer(admin), params={"of": user}, timeout=10)
    assert keys.status_code == 200, keys.text
    (row,) = keys.json()
    return str(row["key_id"])


def test_a_key_revoked_through_one_api_is_refused_by_the_other_within_a_second(
    two_apis: Apis,
) -> None:
    a, url_a, b, url_b = two_apis
    admin = admin_key(a)
    carol = str(_new_user_key(url_a, admin, "carol")["api_key"])
    assert _get(url_b, carol) == 200 and _get(url_b, carol) == 200
    assert b.authenticator is not None
    assert b.authenticator.cache.hits >= 1  # B answers carol from its cache
    key_id = _key_id(url_a, admin, "carol")

    revoked = httpx.delete(f"{url_a}/v1/keys/{key_id}", headers=bearer(admin), timeout=10)
    assert revoked.status_code == 200, revoked.text
    took = _refused_within(url_b, carol, 1.0)
    assert took <= 1.0
    assert _get(url_a, carol) == 401
    again = httpx.delete(f"{url_a}/v1/keys/{key_id}", headers=bearer(admin), timeout=10)
    assert again.status_code == 409 and "already revoked" in again.text

    # Removing a user revokes their keys, and is heard the same way.
    dave = str(_new_user_key(url_a, admin, "dave", roles=["analyst"])["api_key"])
    assert _get(url_b, dave) == 200 and _get(url_b, dave) == 200
    gone = httpx.delete(f"{url_a}/v1/users/dave", headers=bearer(admin), timeout=10)
    assert gone.status_code == 200 and len(gone.json()["revoked_keys"]) == 1
    assert _refused_within(url_b, dave, 1.0) <= 1.0
    users = httpx.get(url_b + "/v1/users", headers=bearer(admin), timeout=10).json()
    assert [u["name"] for u in users] == ["admin", "carol"]

    # A user's demotion reaches the other process's cached actor too.
    erin = str(_new_user_key(url_a, admin, "erin", is_admin=True)["api_key"])
    assert _get(url_b, erin, "/v1/keys") == 200 and _get(url_b, erin, "/v1/keys") == 200
    _new_user_key(url_a, admin, "erin", is_admin=False)
    wait_for(lambda: _get(url_b, erin, "/v1/keys") == 403, timeout=1.0, what="erin demoted")


def test_expired_and_rotated_keys_are_refused(two_apis: Apis) -> None:
    a, url_a, _, url_b = two_apis
    admin = admin_key(a)
    _new_user_key(url_a, admin, "carol")
    h = bearer(admin)
    soon = httpx.post(
        url_a + "/v1/keys",
        headers=h,
        json={"user": "carol", "name": "ci", "expires_in_seconds": 1.5},
        timeout=10,
    )
    assert soon.status_code == 201, soon.text
    short = soon.json()["api_key"]
    assert _get(url_b, short) == 200 and _get(url_b, short) == 200  # cached in B
    # Refused once it expires, by both, with no announcement to hear.
    wait_for(lambda: _get(url_b, short) == 401, timeout=3.0, what="the key expired")
    assert _get(url_a, short) == 401
    listed = httpx.get(url_a + "/v1/keys", headers=h, params={"include_ended": True}).json()
    assert {k["name"]: k["state"] for k in listed if k["user_name"] == "carol"}["ci"] == "expired"

    # Rotation: a new key, the old one refused at once (grace 0) by both.
    old_id = next(k["key_id"] for k in listed if k["user_name"] == "carol" and not k["name"])
    rotated = httpx.post(f"{url_a}/v1/keys/{old_id}/rotate", headers=h, json={}, timeout=10)
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    assert new["replaces"] == old_id and new["user"] == "carol"
    assert _get(url_b, new["api_key"]) == 200
    again = httpx.post(f"{url_a}/v1/keys/{old_id}/rotate", headers=h, json={}, timeout=10)
    assert again.status_code == 409 and "no longer live" in again.text

    # With a grace, the old key works until it ends, then not.
    graced = httpx.post(
        f"{url_a}/v1/keys/{new['key_id']}/rotate",
        headers=h,
        json={"grace_seconds": 1, "expires_in_seconds": 3600},
        timeout=10,
    ).json()
    assert _get(url_b, new["api_key"]) == 200 and _get(url_b, graced["api_key"]) == 200
    wait_for(lambda: _get(url_b, new["api_key"]) == 401, timeout=3.0, what="the grace ended")
    assert _get(url_a, graced["api_key"]) == 200
    states = httpx.get(url_a + "/v1/keys", headers=h, params={"of": "carol"}).json()
    assert [k["state"] for k in states] == ["live"] and states[0]["expires_at"]

    bad = httpx.post(
        url_a + "/v1/keys",
        headers=h,
        json={"user": "carol", "expires_in_seconds": 60, "expires_at": "2999-01-01T00:00:00Z"},
    )
    assert bad.status_code == 422 and "not both" in bad.text
    naive = httpx.post(
        url_a + "/v1/keys", headers=h, json={"user": "carol", "expires_at": "2999-01-01T00:00"}
    )
    assert naive.status_code == 422 and "time zone" in naive.text
    past = httpx.post(
        url_a + "/v1/keys", headers=h, json={"user": "carol", "expires_at": "2001-01-01T00:00Z"}
    )
    assert past.status_code == 422 and "not in the future" in past.text


def test_only_the_orgs_admins_manage_its_users_and_keys(two_apis: Apis) -> None:
    a, url_a, _, url_b = two_apis
    admin = admin_key(a)
    carol = str(_new_user_key(url_a, admin, "carol")["api_key"])
    carol_id = _key_id(url_a, admin, "carol")
    other = uuid.uuid4()
    with a.pool.connection() as conn:
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'other')", (other,))
        eve = create_key(conn, ensure_user(conn, other, "eve", is_admin=True).user_id)

    for method, path, body in (
        ("GET", "/v1/users", None),
        ("POST", "/v1/users", {"name": "mallory", "is_admin": True}),
        ("DELETE", "/v1/users/admin", None),
        ("GET", "/v1/keys", None),
        ("POST", "/v1/keys", {"user": "carol"}),
        ("DELETE", f"/v1/keys/{carol_id}", None),
        ("POST", f"/v1/keys/{carol_id}/rotate", {}),
    ):
        refused = httpx.request(method, url_b + path, headers=bearer(carol), json=body)
        assert refused.status_code == 403, (path, refused.text)
        assert "only org admins" in refused.json()["message"]
    # Another org's admin sees none of this org's keys or users, and cannot touch them.
    assert httpx.get(url_b + "/v1/keys", headers=bearer(eve)).json()[0]["user_name"] == "eve"
    assert len(httpx.get(url_b + "/v1/keys", headers=bearer(eve)).json()) == 1
    assert [u["name"] for u in httpx.get(url_b + "/v1/users", headers=bearer(eve)).json()] == [
        "eve"
    ]
    for method, path in (
        ("DELETE", f"/v1/keys/{carol_id}"),
        ("POST", f"/v1/keys/{carol_id}/rotate"),
    ):
        hidden = httpx.request(method, url_b + path, headers=bearer(eve), json={})
        assert hidden.status_code == 404 and "no API key" in hidden.text
    assert httpx.delete(url_b + "/v1/users/carol", headers=bearer(eve)).status_code == 404
    assert _get(url_a, carol) == 200

    # The last admin is kept: not removed, not demoted; nor is its last key revoked.
    last = httpx.delete(url_a + "/v1/users/admin", headers=bearer(admin))
    assert last.status_code == 409 and "last admin" in last.text
    demote = httpx.post(url_a + "/v1/users", headers=bearer(admin), json={"name": "admin"})
    assert demote.status_code == 409 and "last admin" in demote.text
    admin_id = _key_id(url_a, admin, "admin")
    own = httpx.delete(f"{url_a}/v1/keys/{admin_id}", headers=bearer(admin))
    assert own.status_code == 409 and "live API key" in own.text
    assert _get(url_a, admin, "/v1/keys") == 200
    with psycopg.connect(a.dsn) as conn:  # only digests are stored
        stored = {r[0] for r in conn.execute("SELECT key_hash FROM api_keys")}
    assert carol not in stored and admin not in stored and eve not in stored


def _refused_last_key(answer: httpx.Response) -> None:
    assert answer.status_code == 409, answer.text
    body = answer.json()
    assert body["error"] == "last_admin_key" and "never expires" in body["message"], body


def test_no_change_leaves_the_org_only_admin_keys_that_lapse(two_apis: Apis) -> None:
    """The org's last admin key that never expires is kept: not revoked, not rotated into an
    expiring one, its holder neither removed nor demoted, while the org's other admin keys
    expire or are being rotated (they are live now, and would lock the org out later)."""
    a, url, _, _ = two_apis
    admin = admin_key(a)
    h = bearer(admin)
    durable = _key_id(url, admin, "admin")
    # Creating never takes a key away: an expiring admin key is made.
    soon = httpx.post(
        url + "/v1/keys", headers=h, json={"user": "admin", "expires_in_seconds": 3600}
    )
    assert soon.status_code == 201, soon.text
    _refused_last_key(httpx.delete(f"{url}/v1/keys/{durable}", headers=h))
    _refused_last_key(
        httpx.post(f"{url}/v1/keys/{durable}/rotate", headers=h, json={"expires_in_seconds": 60})
    )
    # Rotated with a grace into a key without expiry: the new one is the durable key, and the
    # old one, being rotated, is not.
    rotated = httpx.post(f"{url}/v1/keys/{durable}/rotate", headers=h, json={"grace_seconds": 60})
    assert rotated.status_code == 201, rotated.text
    new, h = rotated.json(), bearer(rotated.json()["api_key"])
    _refused_last_key(httpx.delete(f"{url}/v1/keys/{new['key_id']}", headers=h))

    # Another admin's durable key is enough; then that admin is the one kept.
    _new_user_key(url, new["api_key"], "erin", is_admin=True)
    revoked = httpx.delete(f"{url}/v1/keys/{new['key_id']}", headers=h)
    assert revoked.status_code == 200, revoked.text
    _refused_last_key(httpx.delete(url + "/v1/users/erin", headers=bearer(admin)))
    _refused_last_key(httpx.post(url + "/v1/users", headers=bearer(admin), json={"name": "erin"}))
    assert _get(url, admin, "/v1/keys") == 200  # the old key's grace: still an admin's key


def test_a_lost_listener_connection_clears_the_cache(services: Services, dsn: str) -> None:
    assert services.listener is not None and services.authenticator is not None
    services.listener.retry_seconds = 0.2
    services.listen()
    assert services.listener.wait_live(10)
    with services.pool.connection() as conn:
        key = create_key(conn, ensure_user(conn, _lite_org(conn), "carol").user_id)
    assert services.authenticate(key) and services.authenticate(key)
    cache = services.authenticator.cache
    assert len(cache) == 1 and cache.hits == 1

    # The listening session ends; announcements in between are unheard, so the cache is
    # cleared and not trusted until it listens again.
    pid = services.listener.backend_pid
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda: services.listener.losses == 1, timeout=5, what="the loss noticed")
        assert len(cache) == 0 and cache.clears >= 1
        # Revoked without an announcement this process hears (its trigger bypassed):
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE api_keys SET revoked_at = now() WHERE key_hash <> ''")
    assert services.authenticate(key) is None
    assert services.listener.wait_live(5) and services.listener.backend_pid != pid
    assert services.authenticate(key) is None

    # Listening again, its cache works and hears changes as before.
    with services.pool.connection() as conn:
        fresh = create_key(conn, ensure_user(conn, _lite_org(conn), "dave").user_id)
    assert services.authenticate(fresh) and services.authenticate(fresh)
    assert len(cache) == 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE api_keys SET revoked_at = now() WHERE revoked_at IS NULL")
    wait_for(lambda: services.authenticate(fresh) is None, timeout=1.0, what="dave revoked")


def _lite_org(conn: psycopg.Connection[object]) -> uuid.UUID:
    from trace_platform.contract import LITE_ORG_ID

    return LITE_ORG_ID


def test_users_and_keys_from_the_cli(dsn: str, tmp_path: Path) -> None:
    env = {"TRACE_STATE_DSN": dsn, "TRACE_HOME": str(tmp_path)}
    added = run(["users", "add", "carol", "--role", "analyst"], env)
    assert added.returncode == 0, added.stdout + added.stderr
    carol = re.search(r"API key \(shown once\): (\S+)", added.stdout)
    assert carol
    made = run(["keys", "create", "carol", "--name", "laptop", "--expires-in", "30d"], env)
    assert made.returncode == 0, made.stdout + made.stderr
    key_id = re.search(r"key ([0-9a-f-]{36}) for 'carol' \(laptop\), expires 20", made.stdout)
    laptop = re.search(r"API key \(shown once\): (\S+)", made.stdout)
    assert key_id and laptop, made.stdout
    listed = run(["keys", "list", "--user", "carol"], env)
    assert listed.returncode == 0 and listed.stdout.count("carol") == 2
    assert laptop.group(1) not in listed.stdout and "laptop" in listed.stdout

    as_carol = {**env, "TRACE_API_KEY": laptop.group(1)}
    refused = run(["keys", "list"], as_carol)
    assert refused.returncode == 1 and "only org admins may list API keys" in refused.stdout

    rotated = run(["keys", "rotate", key_id.group(1)], env)
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    new = re.search(r"API key \(shown once\): (\S+)", rotated.stdout)
    assert new and "(laptop), expires 20" in rotated.stdout

    # The Lite admin rotating its own key: the key file follows.
    admin_file = tmp_path / "admin.key"
    admin_id = re.search(
        r"([0-9a-f-]{36}) +│ admin", run(["keys", "list", "--user", "admin"], env).stdout
    )
    assert admin_id
    own = run(["keys", "rotate", admin_id.group(1)], env)
    assert own.returncode == 0 and "is now the new key" in own.stdout, own.stdout
    assert admin_file.read_text().strip() in own.stdout

    # (expiry values themselves are checked by the control plane: see the HTTP tests)
    bad = run(["keys", "create", "carol", "--expires-at", "tomorrow"], env)
    assert bad.returncode == 1 and "is not an ISO 8601 time" in bad.stdout, bad.stdout

    removed = run(["users", "remove", "carol"], env)
    assert removed.returncode == 0 and "2 key(s) revoked" in removed.stdout, removed.stdout
    users = run(["users", "list", "--removed"], env)
    assert users.returncode == 0 and re.search(r"carol .*│ 0 .*│ 20\d\d-", users.stdout), (
        users.stdout
    )
    last = run(["users", "remove", "admin"], env)
    assert last.returncode == 1 and "last admin" in last.stdout

    # An expiring admin key does not stand for the org's last durable one.
    soon = run(["keys", "create", "admin", "--expires-in", "1h"], env)
    assert soon.returncode == 0, soon.stdout + soon.stderr
    durable = re.search(
        r"([0-9a-f-]{36}) +│ admin .*│ never", run(["keys", "list", "--user", "admin"], env).stdout
    )
    assert durable
    kept = run(["keys", "revoke", durable.group(1)], env)
    assert kept.returncode == 1 and "never expires" in kept.stdout, kept.stdout
