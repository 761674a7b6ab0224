"""The `trace` command line, run as a real subprocess."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.cli import trace as run


def test_config_show_masks_secrets(tmp_path: Path) -> None:
    env = {
        "TRACE_STATE_DSN": "postgresql://alice:hunter2@db.example:5432/trace",
        "TRACE_INTERNAL_TOKEN": "tok-secret",
        "TRACE_HOME": str(tmp_path),
    }
    out = run(["config", "show", "--json"], env)
    assert out.returncode == 0, out.stderr
    assert "hunter2" not in out.stdout and "tok-secret" not in out.stdout
    data = json.loads(out.stdout)
    assert data["state_dsn"] == "postgresql://alice:****@db.example:5432/trace"
    assert data["internal_token"] == "****"
    assert data["queue_driver"] == "pgqueue" and data["profile"] == "lite"
    assert data["embedded_postgres"] is False


def test_aws_profile_without_dsn_is_a_clear_error(tmp_path: Path) -> None:
    out = run(["config", "show"], {"TRACE_PROFILE": "aws", "TRACE_HOME": str(tmp_path)})
    assert out.returncode != 0
    assert "TRACE_STATE_DSN is required" in out.stdout + out.stderr


def test_task_create_wait_and_show_without_workers_then_cancel(dsn: str, tmp_path: Path) -> None:
    env = {"TRACE_STATE_DSN": dsn, "TRACE_HOME": str(tmp_path)}
    created = run(
        ["task", "create", "--job", "cli", "--operator", "noop", "--config", '{"a": 1}'], env
    )
    assert created.returncode == 0, created.stdout + created.stderr
    task_id = re.search(r"task ([0-9a-f-]{36}) queued", created.stdout)
    assert task_id, created.stdout
    shown = run(["task", "show", task_id.group(1)], env)
    assert shown.returncode == 0 and "queued" in shown.stdout and '"a": 1' in shown.stdout
    canceled = run(["task", "cancel", task_id.group(1)], env)
    assert canceled.returncode == 0 and "canceled" in canceled.stdout
    listed = run(["task", "list"], env)
    assert task_id.group(1) in listed.stdout
    bad = run(["task", "create", "--job", "cli", "--operator", "noop", "--config", "{nope"], env)
    assert bad.returncode == 1 and "not valid JSON" in bad.stdout
    missing = run(["task", "show", "00000000-0000-0000-0000-000000000009"], env)
    assert missing.returncode == 1 and "does not exist" in missing.stdout


def test_users_add_is_for_admins_through_the_control_plane(dsn: str, tmp_path: Path) -> None:
    env = {"TRACE_STATE_DSN": dsn, "TRACE_HOME": str(tmp_path)}
    added = run(["users", "add", "carol", "--role", "analyst", "--role", "analyst"], env)
    assert added.returncode == 0, added.stdout + added.stderr
    assert "user 'carol' roles: analyst" in added.stdout
    key = re.search(r"API key \(shown once\): (\S+)", added.stdout)
    assert key, added.stdout
    as_carol = {**env, "TRACE_API_KEY": key.group(1)}
    refused = run(["users", "add", "mallory", "--admin"], as_carol)
    assert refused.returncode == 1 and "only org admins may manage users" in refused.stdout
    bad = run(["users", "add", "dave", "--role", "Not A Role"], env)
    assert bad.returncode == 1 and "role 'Not A Role' must match" in bad.stdout
