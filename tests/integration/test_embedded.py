"""The embedded Postgres: reused across restarts with data intact, clear errors when it cannot run."""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from trace_platform.config import Settings
from trace_platform.db.embedded import (
    _SERVING,
    EmbeddedPostgres,
    EmbeddedPostgresError,
    find_bindir,
)
from trace_platform.db.migrate import migrate
from trace_platform.db.pool import sink_dsn


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


def _socket_login(pg: EmbeddedPostgres, **kw: str) -> psycopg.Connection[tuple[object, ...]]:
    """A login over the unix socket (never a password from the environment or ~/.pgpass)."""
    info = pg.info()
    assert info is not None
    return psycopg.connect(
        host=str(pg.socket_dir),
        port=info.port,
        dbname="trace",
        user="trace",
        passfile="/dev/null",
        connect_timeout=10,
        **kw,
    )


def test_the_socket_asks_for_a_password_too(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    pg = EmbeddedPostgres(root, durable=False)
    info = pg.start()
    with pytest.raises(psycopg.OperationalError, match="password"):
        _socket_login(pg)
    with _socket_login(pg, password=info.password) as conn:  # the socket itself works
        assert conn.execute("SELECT 1").fetchone() == (1,)
    hba = (pg.pgdata / "pg_hba.conf").read_text()
    rules = [ln.split() for ln in hba.splitlines() if ln.strip() and not ln.startswith("#")]
    assert rules and all(r[-1] == "scram-sha-256" for r in rules)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another user")
def test_other_os_users_cannot_get_in(root: Path) -> None:
    pg = EmbeddedPostgres(root, durable=False)
    info = pg.start()
    server = pwd.getpwnam(pg.os_user or "")
    st = root.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, server.pw_gid, 0o710)
    st = pg.socket_dir.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (server.pw_uid, 0o700)
    st = pg.info_file.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    assert pg.log_file.stat().st_mode & 0o777 == 0o600

    def as_nobody(*cmd: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ["PATH"], "PGCONNECT_TIMEOUT": "5"}
        return subprocess.run(
            ["runuser", "-u", "nobody", "--", *cmd], capture_output=True, text=True, env=env
        )

    for cmd in (
        ("ls", str(root)),
        ("ls", str(pg.socket_dir)),
        ("cat", str(pg.info_file)),
        ("cat", str(pg.log_file)),
    ):
        out = as_nobody(*cmd)
        assert out.returncode != 0 and "Permission denied" in out.stderr, (cmd, out)
    psql = as_nobody(
        "psql", "-w", "-h", str(pg.socket_dir), "-p", str(info.port), "-U", "trace", "-d", "trace"
    )
    assert psql.returncode != 0 and "Permission denied" in psql.stderr, psql
    # Even with the cluster root open, the socket directory itself stays shut.
    root.chmod(0o711)
    try:
        out = as_nobody("ls", str(pg.socket_dir))
        assert out.returncode != 0 and "Permission denied" in out.stderr, out
    finally:
        root.chmod(0o710)


def test_a_cluster_initialised_with_trust_is_hardened_on_start(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an older Trace left behind: `trust` on the socket, open directories, a cluster.json
    without the reader login. Both a stopped and a still running cluster get hardened."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    pg = EmbeddedPostgres(root, durable=False)
    info = pg.start()
    trusting = "local all all trust\nlocal replication all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"

    def make_old() -> None:
        (pg.pgdata / "pg_hba.conf").write_text(trusting)
        root.chmod(0o755)
        pg.socket_dir.chmod(0o777)
        raw = json.loads(pg.info_file.read_text())
        pg.info_file.write_text(json.dumps({"port": raw["port"], "password": raw["password"]}))
        pg.info_file.chmod(0o644)

    # Still running from before the upgrade: start() rewrites pg_hba.conf and reloads.
    make_old()
    pg._run(["pg_ctl", "reload", "-D", str(pg.pgdata)])
    with _socket_login(pg) as conn:  # the hole, as it was
        assert conn.execute("SELECT current_user").fetchone() == ("trace",)
    again = EmbeddedPostgres(root, durable=False)
    assert again.start().port == info.port
    with pytest.raises(psycopg.OperationalError, match="password"):
        _socket_login(again)
    assert pg.socket_dir.stat().st_mode & 0o777 == 0o700
    assert pg.info_file.stat().st_mode & 0o777 == 0o600
    assert root.stat().st_mode & 0o777 == (0o710 if pg.os_user else 0o700)
    with psycopg.connect(again.reader_dsn()) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("trace_query",)

    # Stopped before the upgrade: hardened before it starts.
    again.stop()
    make_old()
    third = EmbeddedPostgres(root, durable=False)
    third.start()
    with pytest.raises(psycopg.OperationalError, match="password"):
        _socket_login(third)
    assert "trust" not in (pg.pgdata / "pg_hba.conf").read_text()
    with psycopg.connect(third.reader_dsn()) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("trace_query",)


# What no least-privilege login may have: role attributes, the predefined roles that reach the
# server's files, programs, other sessions or all data, and CREATE on the database.
_POWERS = (
    "rolsuper",
    "rolcreaterole",
    "rolcreatedb",
    "rolreplication",
    "rolbypassrls",
    *(
        f"pg_has_role('{r}', 'USAGE')"
        for r in (
            "pg_read_server_files",
            "pg_write_server_files",
            "pg_execute_server_program",
            "pg_read_all_data",
            "pg_write_all_data",
            "pg_signal_backend",
        )
    ),
    "has_database_privilege(current_database(), 'CREATE')",
)


def _login_of(
    conn: psycopg.Connection[tuple[object, ...]], group: str
) -> tuple[object, object, list[str]]:
    """The connection's login, whether it is in `group`, and which of _POWERS it has."""
    row = conn.execute(
        f"SELECT current_user, pg_has_role(%s, 'USAGE'), {', '.join(_POWERS)}"
        " FROM pg_roles WHERE rolname = current_user",
        [group],
    ).fetchone()
    assert row is not None
    user, member, *powers = row
    return user, member, [p for p, has in zip(_POWERS, powers, strict=True) if has]


def test_the_reader_login_is_not_privileged(root: Path) -> None:
    pg = EmbeddedPostgres(root, durable=False)
    pg.start()
    assert EmbeddedPostgres.serving(pg.dsn("other")) is pg  # how a DSN finds its reader
    with psycopg.connect(pg.reader_dsn(), autocommit=True) as conn:
        assert _login_of(conn, "trace_published_read") == ("trace_query", True, [])
        conn.execute("SET default_transaction_read_only = off")
        for stmt in (
            "CREATE TEMP TABLE t (x int)",
            "CREATE TABLE public.t (x int)",
            "SELECT pg_read_file('postgresql.auto.conf')",
            "COPY (SELECT 1) TO PROGRAM 'id'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(stmt)
    # The password never went to the server in clear: not in its log either.
    info = pg.info()
    assert info is not None and info.reader_password not in pg.log_file.read_text()


def test_the_sink_login_is_not_privileged(root: Path) -> None:
    pg = EmbeddedPostgres(root, durable=False)
    pg.start()
    migrate(pg.dsn())
    with psycopg.connect(pg.sink_dsn(), autocommit=True) as conn:
        assert _login_of(conn, "trace_sink_write") == ("trace_sink", True, [])
        for stmt in (
            "SELECT * FROM public.secrets",
            "SELECT * FROM public.api_keys",
            "SELECT * FROM public.task_registry",
            "CREATE TABLE public.t (x int)",
            "CREATE SCHEMA trace",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(stmt)
        # What the sink does: a dataset schema through 0010's function, a table of its own, a
        # published view; the Query Service's login reads both (0009's event trigger).
        schema = f"dataset_{'ab' * 16}"
        conn.execute("SELECT trace_sink_ddl.ensure_schema(%s)", [schema])
        conn.execute(f"CREATE TABLE {schema}.v_1 AS SELECT 7 AS x")
        conn.execute(f"CREATE OR REPLACE VIEW published.seven AS SELECT * FROM {schema}.v_1")
        # The buffered-dataset sink stages a batch in a temporary table (migration 0031).
        with conn.transaction():
            conn.execute(f"CREATE TEMP TABLE stage (LIKE {schema}.v_1) ON COMMIT DROP")
    with psycopg.connect(pg.reader_dsn(), autocommit=True) as conn:
        assert conn.execute(f"SELECT x FROM {schema}.v_1").fetchone() == (7,)
        assert conn.execute("SELECT x FROM published.seven").fetchone() == (7,)
    info = pg.info()
    assert info is not None and info.sink_password not in pg.log_file.read_text()


def test_a_worker_finds_the_sink_login_of_the_state_dsn(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker is a process of its own: it gets the superuser's DSN and finds the cluster's
    cluster.json through the server's data directory (and only when the password matches)."""
    pg = EmbeddedPostgres(root, durable=False)
    info = pg.start()
    migrate(pg.dsn("postgres"))
    monkeypatch.delitem(_SERVING, info.port)  # as in another process
    settings = Settings(state_dsn=pg.dsn("postgres"), home=root.parent / "home")
    got = psycopg.conninfo.conninfo_to_dict(sink_dsn(settings, pg.dsn("postgres")))
    assert (got["user"], got["dbname"], got["port"]) == ("trace_sink", "postgres", str(info.port))
    with psycopg.connect(sink_dsn(settings, pg.dsn("postgres"))) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("trace_sink",)
    explicit = "postgresql://mine:pw@db.example/data"
    assert sink_dsn(Settings(data_dsn=explicit, state_dsn=pg.dsn()), pg.dsn()) == explicit
    # Not the superuser, or not this cluster's password: no cluster.json is trusted.
    wrong = pg.dsn().replace(info.password, "not-the-password")
    for dsn in (pg.reader_dsn(), wrong):
        assert EmbeddedPostgres.logins_of(dsn) is None
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert sink_dsn(settings, dsn) == dsn
        assert "TRACE_DATA_DSN" in caplog.text
    # The superuser gets in, but the cluster.json it finds holds another password.
    right = pg.dsn()
    pg.info_file.write_text(json.dumps({"port": info.port, "password": "another"}))
    assert EmbeddedPostgres.logins_of(right) is None


def test_an_older_cluster_json_gets_a_sink_login(root: Path) -> None:
    pg = EmbeddedPostgres(root, durable=False)
    pg.start()
    pg.stop()
    raw = json.loads(pg.info_file.read_text())
    pg.info_file.write_text(
        json.dumps({k: raw[k] for k in ("port", "password", "reader_password")})
    )
    again = EmbeddedPostgres(root, durable=False)
    info = again.start()
    assert info.sink_password and info.reader_password == raw["reader_password"]
    assert json.loads(pg.info_file.read_text())["sink_password"] == info.sink_password
    assert pg.info_file.stat().st_mode & 0o777 == 0o600
    with psycopg.connect(again.sink_dsn()) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("trace_sink",)
