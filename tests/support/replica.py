"""A real streaming replica for tests: a hot standby of an embedded cluster, made by
`pg_basebackup -R` into a data directory of its own, run as the cluster's unprivileged OS user
(initdb and postgres refuse root) on a free port. The embedded cluster already streams: its
wal_level is `replica` (Postgres's default), it has WAL senders, and initdb's pg_hba lets its
superuser replicate over 127.0.0.1 with its password."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trace_platform.db.embedded import EmbeddedPostgres, free_port


class StreamingReplica:
    def __init__(self, primary: EmbeddedPostgres, root: Path) -> None:
        self.primary = primary
        self.root = root
        self.port = free_port()

    @property
    def pgdata(self) -> Path:
        return self.root / "data"

    def _run(self, *args: str) -> None:
        cmd = [str(self.primary.bindir / args[0]), *args[1:]]
        if self.primary.os_user:
            cmd = ["runuser", "-u", self.primary.os_user, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            log = self.root / "postgres.log"
            tail = log.read_text().splitlines()[-10:] if log.exists() else []
            raise RuntimeError(f"{args[0]} failed: {proc.stderr.strip()}\n" + "\n".join(tail))

    def start(self) -> StreamingReplica:
        self.root.mkdir(mode=0o700)
        (self.root / "run").mkdir(mode=0o700)
        for path in (self.root, self.root / "run"):
            self.primary._chown(path)
        source = conninfo_to_dict(self.primary.dsn("postgres"))
        self._run(
            "pg_basebackup",
            "-D",
            str(self.pgdata),
            "-R",  # standby.signal and primary_conninfo: it follows the primary from here on
            "-X",
            "stream",
            "-c",
            "fast",
            "-d",
            make_conninfo(**{k: source[k] for k in ("host", "port", "user", "password")}),
        )
        with (self.pgdata / "postgresql.auto.conf").open("a") as f:  # after the copied lines
            f.write(f"unix_socket_directories = '{self.root / 'run'}'\nhot_standby = on\n")
        self._run(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            "60",
            "-D",
            str(self.pgdata),
            "-l",
            str(self.root / "postgres.log"),
            "-o",
            f"-p {self.port}",
        )
        return self

    def dsn(self, dbname: str) -> str:
        """The superuser's DSN on the replica (its roles and passwords are the primary's)."""
        return make_conninfo(self.primary.dsn(dbname), port=self.port)

    def _sql(self, query: str) -> object:
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            row = conn.execute(query).fetchone()
        return row[0] if row else None

    def pause(self) -> None:
        """Stops replaying WAL (it still receives it): what the primary commits from now on is
        not seen here until `resume`."""
        self._sql("SELECT pg_wal_replay_pause()")
        deadline = time.monotonic() + 30
        while self._sql("SELECT pg_get_wal_replay_pause_state()") != "paused":
            if time.monotonic() > deadline:
                raise AssertionError("the replica did not pause its replay")
            time.sleep(0.02)

    def resume(self) -> None:
        self._sql("SELECT pg_wal_replay_resume()")

    def caught_up(self, timeout: float = 30.0) -> None:
        """Waits until the replica replayed everything the primary wrote before this call."""
        with psycopg.connect(self.primary.dsn("postgres"), autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            while True:
                done = conn.execute(
                    "SELECT %s::pg_lsn <= pg_last_wal_replay_lsn()", (row[0],)
                ).fetchone()
                if done and done[0]:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"the replica did not replay up to {row[0]}")
                time.sleep(0.02)

    def destroy(self) -> None:
        if (self.pgdata / "postmaster.pid").exists():
            self._run("pg_ctl", "stop", "-D", str(self.pgdata), "-m", "immediate", "-w")
