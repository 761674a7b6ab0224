"""First start of a Lite install: one org, an admin user, and an admin API key that is shown
once and kept (0600) under the Lite home for the CLI."""

from __future__ import annotations

import os
from pathlib import Path

from psycopg_pool import ConnectionPool

from trace_platform.config import Settings
from trace_platform.identity import bootstrap_lite


def key_file(settings: Settings) -> Path:
    return settings.home / "admin.key"


def bootstrap(settings: Settings, pool: ConnectionPool) -> str | None:
    """Returns the admin key if this call created it (print it once), else None."""
    with pool.connection() as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('trace_bootstrap'))")
        _, key = bootstrap_lite(conn)
    if key is not None:
        path = key_file(settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
    return key
