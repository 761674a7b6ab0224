"""A real streaming replica for tests: a hot standby of an embedded cluster, made by
`pg_basebackup -R` into a data directory of its own, run as the cluster's unprivileged OS user
(initdb and postgres refuse root) on a free port. The embedded cluster already streams: its
wal_level is `replica` (Postgres's default), it has WAL senders, and initdb's pg_hba lets its
superuser replicate over 127.0.0.1 with its password."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from trace_platform.db.embedded import ClusterInfo, EmbeddedPostgres, free_port


class StreamingReplica:
    """The standby's directory is laid out as an embedded cluster's (data, run, postgres.log,
    cluster.json with its port and the primary's superuser password), so the embedded
    cluster's own machinery runs it."""

    def __init__(self, primary: EmbeddedPostgres, root: Path) -> None:
        self.primary = primary
        self.pg = EmbeddedPostgres(root, bindir=primary.bindir, os_user=primary.os_user)

    def start(self) -> StreamingReplica:
        pg, primary = self.pg, self.primary.info()
        assert primary is not None
        pg.root.mkdir()
        pg._secure_dirs()
        pg.pgdata.mkdir(mode=0o700)  # pg_basebackup, run as the server's OS user, fills it
        pg._chown(pg.pgdata)
        source = conninfo_to_dict(self.primary.dsn("postgres"))
        pg._run(
            [
                "pg_basebackup",
                "-D",
                str(pg.pgdata),
                "-R",  # standby.signal and primary_conninfo: it follows the primary from now on
                "-X",
                "stream",
                "-c",
                "fast",
                "-d",
                make_conninfo(**{k: source[k] for k in ("host", "port", "user", "password")}),
            ]
        )
        with (pg.pgdata / "postgresql.auto.conf").open("a") as f:  # after the copied lines
            f.write(f"unix_socket_directories = '{pg.socket_dir}'\nhot_standby = on\n")
        info = ClusterInfo(port=free_port(), password=primary.password)
        pg._write_info(info)
        pg._start_server(info)
        return self

    def dsn(self, dbname: str) -> str:
        """The superuser's DSN on the replica (its roles and passwords are the primary's)."""
        return self.pg.dsn(dbname)

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
        self.pg.stop("immediate")
