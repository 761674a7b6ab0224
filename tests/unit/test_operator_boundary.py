"""The operator host never inherits internal credentials or database access."""

from __future__ import annotations

from pathlib import Path

import pytest

from trace_platform.dispatcher.models import TaskPayload
from trace_platform.worker.wrapper import OperatorHost


def test_host_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRACE_INTERNAL_TOKEN", "secret")
    monkeypatch.setenv("TRACE_STATE_DSN", "postgresql://u:p@h/db")
    monkeypatch.setenv("PGPASSWORD", "p")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "k")
    monkeypatch.setenv("HARMLESS", "1")
    env = OperatorHost(tmp_path / "log", tmp_path / "work")._env()
    assert "HARMLESS" in env
    leaked = [k for k in env if k.startswith(("TRACE_INTERNAL", "TRACE_STATE", "PG", "AWS_"))]
    assert leaked == []
    assert "secret" not in "".join(env.values())


def test_task_payload_carries_no_lease_token() -> None:
    assert not any("lease_token" in f or "token" in f for f in TaskPayload.model_fields)
