"""The secret vault: where its key comes from, and what a sealed value opens to."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr

from trace_platform.config import Settings
from trace_platform.identity.vault import SecretsUnavailable, Vault, key_file

ORG = uuid.uuid4()


def lite(tmp_path: Path, key: str | None = None) -> Settings:
    return Settings(
        home=tmp_path, state_dsn="postgresql://x@localhost/x", secrets_key=key and SecretStr(key)
    )


def test_lite_creates_a_private_key_file_once(tmp_path: Path) -> None:
    v = Vault(lite(tmp_path))
    sealed = v.seal(ORG, "k", "hunter2")
    assert "hunter2" not in sealed
    path = key_file(lite(tmp_path))
    assert path.stat().st_mode & 0o777 == 0o600
    assert Vault(lite(tmp_path)).open(ORG, "k", sealed) == "hunter2"  # the same key, reused


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    Vault(lite(tmp_path)).seal(ORG, "k", "v")
    key_file(lite(tmp_path)).chmod(0o644)
    with pytest.raises(SecretsUnavailable, match="chmod 600"):
        Vault(lite(tmp_path)).seal(ORG, "k", "v")


def test_aws_without_a_key_refuses_clearly(tmp_path: Path) -> None:
    s = Settings(
        profile="aws",
        home=tmp_path,
        state_dsn="postgresql://x@db/x",
        operator_registry="production",
    )
    with pytest.raises(SecretsUnavailable, match="TRACE_SECRETS_KEY is required"):
        Vault(s).seal(ORG, "k", "v")
    assert not key_file(s).exists()


def test_configured_keys_rotate_and_bad_ones_are_clear(tmp_path: Path) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    sealed = Vault(lite(tmp_path, old)).seal(ORG, "k", "v")
    assert Vault(lite(tmp_path, f"{new},{old}")).open(ORG, "k", sealed) == "v"
    with pytest.raises(SecretsUnavailable, match="cannot be decrypted"):
        Vault(lite(tmp_path, new)).open(ORG, "k", sealed)
    with pytest.raises(SecretsUnavailable, match="not a Fernet key"):
        Vault(lite(tmp_path, "nope")).seal(ORG, "k", "v")
    assert not key_file(lite(tmp_path)).exists()  # a configured key never writes a file


def test_a_value_opens_only_as_the_secret_it_was_sealed_for(tmp_path: Path) -> None:
    v = Vault(lite(tmp_path))
    sealed = v.seal(ORG, "mine", "v")
    with pytest.raises(SecretsUnavailable, match="sealed for another secret"):
        v.open(ORG, "theirs", sealed)
    with pytest.raises(SecretsUnavailable, match="sealed for another secret"):
        v.open(uuid.uuid4(), "mine", sealed)
