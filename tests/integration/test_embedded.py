"""The embedded Postgres: reused across restarts with data intact, clear errors when it cannot run."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from trace_platform.db.embedded import EmbeddedPostgres, EmbeddedPostgresError, find_bindir


@pytest.fixture
def root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="trace-emb-", dir="/tmp"))
    d.chmod(0o755)
    yield d / "pg"
    EmbeddedPostgres(d / "pg", durable=False).destroy()


def test_survives_restart_with_data_intact(root: Path) -> None:
    pg = EmbeddedPostgres(root, durable=False)
    info = pg.start()
    with psycopg.connect(pg.dsn()) as conn:
        conn.execute("CREATE TABLE kept (v int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    pg.stop()
    assert not pg.running()
    again = EmbeddedPostgres(root, durable=False)  # a new process would do exactly this
    assert again.start().port == info.port
    with psycopg.connect(again.dsn()) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone() == (42,)
    st = again.status()
    assert st["running"] and st["initialized"] and st["port"] == info.port
    assert (root / "cluster.json").stat().st_mode & 0o777 == 0o600
    # Listening on loopback only, with a password for TCP.
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"postgresql://trace:wrong@127.0.0.1:{info.port}/trace")


def test_binaries_found() -> None:
    assert (find_bindir() / "initdb").exists()


def test_explicit_bindir_without_server_binaries_falls_through(tmp_path: Path) -> None:
    # A directory without initdb is skipped in favour of the next candidate.
    assert find_bindir(tmp_path) != tmp_path


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another user")
def test_unreachable_data_dir_is_a_clear_error() -> None:
    private = Path(tempfile.mkdtemp(prefix="trace-private-", dir="/tmp"))
    private.chmod(0o700)
    try:
        with pytest.raises(EmbeddedPostgresError, match="cannot enter"):
            EmbeddedPostgres(private / "pg", durable=False).init()
    finally:
        shutil.rmtree(private, ignore_errors=True)
