"""Applies `migrations/NNNN_name.sql` in order, once each, under an advisory lock."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

import psycopg

_LOCK_KEY = 0x7472_6163  # "trac": one migrator at a time per database


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


class MigrationError(RuntimeError):
    pass


def available() -> list[Migration]:
    root = resources.files("trace_platform.db") / "migrations"
    out = []
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            version, _, rest = entry.name.partition("_")
            out.append(Migration(version, rest.removesuffix(".sql"), entry.read_text()))
    return out


def migrate(dsn: str) -> list[str]:
    """Brings the database up to date; returns the versions applied by this call."""
    applied_now: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            conn.execute(
                """CREATE TABLE IF NOT EXISTS schema_migrations (
                     version    TEXT PRIMARY KEY,
                     name       TEXT NOT NULL,
                     checksum   TEXT NOT NULL,
                     applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"""
            )
            done = dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())
            for m in available():
                if m.version in done:
                    if done[m.version] != m.checksum:
                        raise MigrationError(
                            f"migration {m.version}_{m.name} changed after it was applied; "
                            "add a new migration instead of editing an applied one"
                        )
                    continue
                with conn.transaction():
                    conn.execute(m.sql)  # type: ignore[arg-type]
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (m.version, m.name, m.checksum),
                    )
                applied_now.append(m.version)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now
