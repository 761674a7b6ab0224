"""Helpers for tests whose operators run in the sandbox (its own user and mount namespace)."""

from __future__ import annotations

import json
from pathlib import Path


def record_dir(tmp_path: Path) -> Path:
    """A directory the sandboxed test operators may write to (bound into the sandbox at the
    same path; world-writable so the sandbox user can create files in it)."""
    d = tmp_path / "records"
    d.mkdir(exist_ok=True)
    d.chmod(0o777)
    return d


def bind_env(tmp_path: Path) -> dict[str, str]:
    """Worker env that binds `record_dir(tmp_path)` into every operator sandbox."""
    return {"TRACE_SANDBOX_EXTRA_BINDS": json.dumps([str(record_dir(tmp_path))])}
