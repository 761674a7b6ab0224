"""First start of a Lite install: one org, an admin user, and an admin API key that is shown
once and kept (0600) under the Lite home for the CLI."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from psycopg_pool import ConnectionPool

from trace_platform.config import Settings
from trace_platform.identity import bootstrap_lite
from trace_platform.store.identity import IdentityStore


def key_file(settings: Settings) -> Path:
    return settings.home / "admin.key"


def bootstrap(settings: Settings, pool: ConnectionPool) -> str | None:
    """Returns the admin key if this call created it (print it once), else None."""
    settings.home.mkdir(parents=True, exist_ok=True)
    # Traversable (the embedded Postgres's server user reaches its data dir through it) but not
    # listable; everything secret inside is 0600, and the operator sandbox never sees it.
    settings.home.chmod(0o711)
    with pool.connection() as conn, conn.transaction():
        IdentityStore(conn).lock_bootstrap()
        _, key = bootstrap_lite(conn)
    if key is not None:
        _write_private(key_file(settings), key, replace=True)
    return key


def internal_token_file(settings: Settings) -> Path:
    return settings.home / "internal.token"


def _write_private(path: Path, text: str, *, replace: bool = False) -> None:
    """A new file, 0600 (FileExistsError if there is one, unless `replace`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


def internal_token(settings: Settings, *, create: bool = False) -> str | None:
    """The credential of the platform's own components on /internal/*: TRACE_INTERNAL_TOKEN,
    else (Lite) a token generated on first start and kept 0600 under the home. It is never put
    in an operator's environment."""
    if settings.internal_token is not None:
        return settings.internal_token.get_secret_value()
    path = internal_token_file(settings)
    if create and not path.exists():
        with contextlib.suppress(FileExistsError):  # another process made it first
            _write_private(path, secrets.token_urlsafe(32))
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
