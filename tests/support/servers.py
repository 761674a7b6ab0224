"""What several test modules stand up: an API that requires keys, and an empty database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from trace_platform.config import Settings
from trace_platform.db.embedded import free_port
from trace_platform.lite.stack import ApiServer
from trace_platform.services import Services


@contextmanager
def secured_api(settings: Settings, dsn: str) -> Iterator[tuple[Services, str]]:
    """Services with `auth: required` and an API serving them: (services, base URL)."""
    svc = Services.build(settings.model_copy(update={"auth": "required"}), dsn)
    server = ApiServer(svc, "127.0.0.1", free_port(), background=False)
    server.start()
    try:
        yield svc, server.url
    finally:
        server.stop()
        svc.close()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def admin_key(svc: Services) -> str:
    """The Lite admin's key: as the first start printed it, else as it saved it."""
    return svc.new_admin_key or (svc.settings.home / "admin.key").read_text().strip()


@contextmanager
def empty_database(pg_server: str) -> Iterator[str]:
    """A new database with no migration applied (dropped afterwards): its DSN."""
    name = f"e_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(pg_server, dbname=name)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
