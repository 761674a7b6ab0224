"""Secrets of worker pool slots: who may use and manage them, and their encryption at rest.

Values are sealed with Fernet (AES-128-CBC + HMAC-SHA256). The key is `Settings.secrets_key`
(several comma-separated keys rotate: the first seals, any of them opens); without one, a Lite
install keeps a key in `{home}/secrets.key` (0600, created on first use) and the aws profile
refuses. Each sealed value also names its org and secret, so a ciphertext copied into another
row does not open there. Values are opened only by the Dispatcher when it hands a running
task its slot's secrets: no API returns them, nothing logs them.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any
from uuid import UUID

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from psycopg import Connection

from trace_platform.config import Profile, Settings
from trace_platform.errors import Invalid, TraceError
from trace_platform.identity import Actor
from trace_platform.store.secrets import SecretStore

# The rule of the `secrets.name` CHECK constraint (migration 0003), checked before touching it.
SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
SECRET_NAME_RULE = "must match ^[A-Za-z_][A-Za-z0-9_.-]{0,127}$ (letters, digits, _ . -)"


class SecretsUnavailable(TraceError):
    """No usable key: the aws profile without TRACE_SECRETS_KEY, a malformed key, or a value
    sealed under a key this install no longer has."""

    status_code = 503
    code = "secrets_unavailable"


def check_secret_name(name: str) -> None:
    if not SECRET_NAME.fullmatch(name):
        raise Invalid(f"secret name {name!r} {SECRET_NAME_RULE}", rule=SECRET_NAME.pattern)


# -- who may do what -----------------------------------------------------------------------
def can_use_secret(actor: Actor, secret: dict[str, Any]) -> bool:
    """Naming a secret in a worker pool slot (checked at deploy and again when a task gets it):
    org admins, its owner, and holders of one of its use_roles."""
    return actor.org_id == secret["org_id"] and (
        actor.is_admin
        or secret["owner_user_id"] == actor.user_id
        or actor.has_any(secret["use_roles"])
    )


def can_manage_secret(actor: Actor, secret: dict[str, Any]) -> bool:
    """Overwriting a secret's value or changing its use_roles: its owner and org admins."""
    return actor.org_id == secret["org_id"] and (
        actor.is_admin or secret["owner_user_id"] == actor.user_id
    )


# -- the key ---------------------------------------------------------------------------------
def key_file(settings: Settings) -> Path:
    return settings.home / "secrets.key"


def _lite_key(settings: Settings) -> bytes:
    """The Lite key file, created 0600 by whoever gets there first."""
    path = key_file(settings)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(Fernet.generate_key() + b"\n")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise SecretsUnavailable(
            f"the secrets key file {path} is readable by others (mode {mode:o}); "
            f"run: chmod 600 {path}"
        )
    return path.read_bytes().strip()


class Vault:
    """Seals and opens secret values for one install (its key is loaded on first use)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._fernet: MultiFernet | None = None
        self._lock = threading.Lock()

    def _keys(self) -> list[bytes]:
        s = self.settings
        if s.secrets_key is not None:
            keys = [k.strip() for k in s.secrets_key.get_secret_value().split(",") if k.strip()]
            return [k.encode() for k in keys]
        if s.profile is Profile.aws:
            raise SecretsUnavailable(
                "TRACE_SECRETS_KEY is required in the aws profile to store or use secrets "
                "(a Fernet key: python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())')"
            )
        return [_lite_key(s)]

    @property
    def fernet(self) -> MultiFernet:
        with self._lock:
            if self._fernet is None:
                try:
                    self._fernet = MultiFernet([Fernet(k) for k in self._keys()])
                except ValueError:
                    raise SecretsUnavailable(
                        "the secrets key is not a Fernet key (32 url-safe base64-encoded bytes)"
                    ) from None
            return self._fernet

    def seal(self, org_id: UUID, name: str, value: str) -> str:
        payload = json.dumps({"org_id": str(org_id), "name": name, "value": value})
        return self.fernet.encrypt(payload.encode()).decode()

    def open(self, org_id: UUID, name: str, ciphertext: str) -> str:
        try:
            payload = json.loads(self.fernet.decrypt(ciphertext.encode()))
        except InvalidToken:
            raise SecretsUnavailable(
                f"secret '{name}' cannot be decrypted with this install's secrets key "
                "(was the key changed or lost?)"
            ) from None
        if payload.get("org_id") != str(org_id) or payload.get("name") != name:
            raise SecretsUnavailable(f"secret '{name}' holds a value sealed for another secret")
        value: str = payload["value"]
        return value

    def seal_legacy(self, conn: Connection[Any]) -> int:
        """Encrypts values stored in plaintext before migration 0008 (at start, or by the
        Dispatcher if a task meets one first); returns how many. With none: one query, no
        lock, no key."""
        with conn.transaction():
            rows = SecretStore(conn).legacy_plaintext().fetchall()
            for r in rows:
                SecretStore(conn).seal_legacy(
                    org_id=r["org_id"],
                    name=r["name"],
                    ciphertext=self.seal(r["org_id"], r["name"], r["legacy_value"]),
                )
        return len(rows)


_VAULTS: dict[tuple[str | None, str, str], Vault] = {}
_VAULTS_LOCK = threading.Lock()


def vault_for(settings: Settings) -> Vault:
    """One Vault per (key, home, profile), shared by the control plane and the Dispatcher."""
    key = settings.secrets_key.get_secret_value() if settings.secrets_key else None
    ident = (key, str(settings.home.resolve()), str(settings.profile))
    with _VAULTS_LOCK:
        if ident not in _VAULTS:
            _VAULTS[ident] = Vault(settings)
        return _VAULTS[ident]
