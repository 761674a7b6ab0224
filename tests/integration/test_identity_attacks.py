"""Attacks on identity management, the API key cache and the audit log (issue 42): each test
is a flaw found by trying to break them, kept so it stays fixed."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.servers import admin_key, bearer, secured_api
from tests.support.wait import wait_for
from trace_platform import audit
from trace_platform.api.auth import actor_dependency
from trace_platform.config import Settings
from trace_platform.contract import LITE_ORG_ID
from trace_platform.db.invalidation import InvalidationListener
from trace_platform.errors import Invalid, Unauthorized
from trace_platform.identity import create_key, ensure_user, lite_admin
from trace_platform.identity.actors import Authenticator
from trace_platform.services import Services


class FreezingProxy:
    """A TCP proxy to Postgres whose open connections can be made to go silent: bytes either
    way are swallowed while the sockets stay open (the kernel still acknowledges them), as a
    stalled middlebox, a hung server or a failed-over host behind a NAT would. Connections
    made after the freeze pass as usual."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.frozen: set[socket.socket] = set()
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.open += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, client: socket.socket) -> None:
        with suppress(OSError):
            while data := src.recv(65536):
                if client not in self.frozen:
                    dst.sendall(data)
        for s in (src, dst):
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def freeze(self) -> None:
        """Every connection open now goes silent."""
        with self.lock:
            self.frozen.update(s for s in self.open if s.getsockname()[1] == self.port)

    def close(self) -> None:
        self.server.close()
        with self.lock:
            for s in self.open:
                s.close()


@contextmanager
def _proxied(dsn: str) -> Iterator[tuple[FreezingProxy, str]]:
    params = conninfo_to_dict(dsn)
    proxy = FreezingProxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    try:
        yield proxy, make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
    finally:
        proxy.close()


def test_a_silent_listener_connection_stops_the_cache_within_a_second(
    services: Services, dsn: str
) -> None:
    """The listener's peer stops answering without closing (kernel still ACKs): its ping hung
    forever and the cache stayed trusted, so a key revoked meanwhile was still accepted for the
    whole 30 s TTL, and the listener never connected again."""
    with _proxied(dsn) as (proxy, via_proxy):
        listener = InvalidationListener(via_proxy, retry_seconds=0.1, dead_seconds=2.0)
        listener.start()
        try:
            assert listener.wait_live(10)
            auth = Authenticator(services.pool, listener)
            with services.pool.connection() as conn:
                key = create_key(conn, ensure_user(conn, LITE_ORG_ID, "carol").user_id)
            assert auth.authenticate(key) and auth.authenticate(key)
            assert auth.cache.hits == 1  # carol is answered from the cache

            proxy.freeze()
            with psycopg.connect(dsn, autocommit=True) as conn:  # the announcement goes nowhere
                conn.execute("UPDATE api_keys SET revoked_at = now() WHERE revoked_at IS NULL")
            start = time.monotonic()
            wait_for(lambda: auth.authenticate(key) is None, timeout=3, what="carol refused")
            assert time.monotonic() - start <= 1.2

            # The hung connection is given up and a new one listens: the cache works again.
            wait_for(lambda: listener.losses == 1 and listener.live, timeout=10, what="relisten")
            with services.pool.connection() as conn:
                fresh = create_key(conn, ensure_user(conn, LITE_ORG_ID, "dave").user_id)
            hits = auth.cache.hits
            assert auth.authenticate(fresh) and auth.authenticate(fresh)
            assert auth.cache.hits == hits + 1
        finally:
            listener.stop()


def test_out_of_range_expiries_and_spans_are_refused_by_name(settings: Settings, dsn: str) -> None:
    """An expiry past year 9999, a --since before year 1, or an expiry already past by the
    database's clock were 500s (an OverflowError, the table's CHECK), not answers naming the
    field."""
    with secured_api(settings, dsn) as (svc, url):
        admin = bearer(admin_key(svc))
        far = {"user": "admin", "expires_in_seconds": 1e15}
        made = httpx.post(url + "/v1/keys", headers=admin, json=far, timeout=10)
        assert made.status_code == 422 and "expires_in" in made.text, made.text
        # Now by this host's clock, but already past when the database stores it.
        now_ish = {"user": "admin", "expires_in_seconds": 1e-6}
        made = httpx.post(url + "/v1/keys", headers=admin, json=now_ish, timeout=10)
        assert made.status_code == 422 and "database's clock" in made.text, made.text
        key_id = str(httpx.get(url + "/v1/keys", headers=admin, timeout=10).json()[0]["key_id"])
        turned = httpx.post(f"{url}/v1/keys/{key_id}/rotate", headers=admin, json=far, timeout=10)
        assert turned.status_code == 422 and "expires_in" in turned.text, turned.text
        for since in ("999999w", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
            page = httpx.get(url + "/v1/audit", headers=admin, params={"since": since}, timeout=10)
            assert page.status_code == 422 and "since" in page.text, (since, page.text)
        # Nothing was stored by the refusals: the admin's one key, live.
        (only,) = httpx.get(url + "/v1/keys", headers=admin, timeout=10).json()
        assert only["state"] == "live"


def test_no_user_passes_for_the_platform_in_the_audit_log(services: Services) -> None:
    """A user could be named system, scheduler or eventbridge: their actions then read in
    `trace audit list` as the platform's own, and `--actor system` mixed them in."""
    with services.pool.connection() as conn:
        admin = lite_admin(conn)
    for name in ("system", "scheduler", "eventbridge", "System"):
        with pytest.raises(Invalid, match="reserved"):
            services.control.add_user(admin, name, [], is_admin=True)
    # One so named before (made by SQL, as orgs are): still not the platform when filtered.
    with services.pool.connection() as conn, conn.transaction():
        impostor = ensure_user(conn, LITE_ORG_ID, "system", is_admin=True)
        audit.record(conn, impostor, "dag.pause", "hello")
        audit.record(conn, "system", "dag.cutover", "hello", org_id=LITE_ORG_ID)
    platform = services.control.audit_log(admin, who="system")["entries"]
    assert [(e["actor_kind"], e["action"]) for e in platform] == [("system", "dag.cutover")]


def test_a_removed_lite_admin_is_not_acted_as_without_a_key(services: Services) -> None:
    """With TRACE_AUTH=permissive a key-less call acts as the Lite admin: even after another
    admin removed that user (their keys revoked), a call with no key still acted as them, an
    admin, so removing a compromised Lite admin changed nothing for key-less callers."""
    assert services.settings.auth == "permissive"
    actor = actor_dependency(services)
    lite = actor(None)
    assert lite.name == "admin" and lite.is_admin
    ops_key = services.control.add_user(lite, "ops", [], is_admin=True)["api_key"]
    ops = actor(f"Bearer {ops_key}")
    services.control.identity.remove_user(ops, "admin")
    with pytest.raises(Unauthorized, match="removed"):
        actor(None)
    assert actor(f"Bearer {ops_key}").name == "ops"
