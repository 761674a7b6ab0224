"""An embedded Postgres cluster in a data directory: the Lite default and the test harness.

The cluster listens on 127.0.0.1 only, on a free port recorded in the data directory, and is
reused across runs. As root it runs as an unprivileged system user, since initdb refuses root.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

DB_NAME = "trace"
SUPERUSER = "trace"


class EmbeddedPostgresError(RuntimeError):
    pass


def _has_initdb(path: Path) -> bool:
    return (path / "initdb").is_file() and (path / "pg_ctl").is_file()


def find_bindir(explicit: Path | None = None) -> Path:
    """Server binaries: explicit/TRACE_PG_BINDIR, pg_config, newest Debian dir, else pgserver."""
    candidates: list[Path] = []
    if explicit:
        candidates.append(Path(explicit))
    if os.environ.get("TRACE_PG_BINDIR"):
        candidates.append(Path(os.environ["TRACE_PG_BINDIR"]))
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(Path(p) for p in debian)
    # Locate pgserver without importing it (its import has side effects and warnings).
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "pginstall" / "bin")
    for c in candidates:
        if _has_initdb(c):
            return c
    raise EmbeddedPostgresError(
        "No Postgres server binaries found. Install them (Debian/Ubuntu: "
        "`apt-get install postgresql`), or `pip install pgserver==0.1.4`, "
        "or set TRACE_PG_BINDIR to a directory holding initdb and pg_ctl, "
        "or point TRACE_STATE_DSN at an existing server."
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class ClusterInfo:
    port: int
    password: str


class EmbeddedPostgres:
    """Owns one cluster in `root`: `root/data` (PGDATA), `root/cluster.json`, `root/postgres.log`."""

    def __init__(
        self,
        root: Path,
        *,
        bindir: Path | None = None,
        os_user: str | None = None,
        durable: bool = True,
    ) -> None:
        self.root = Path(root).absolute()
        self.bindir = find_bindir(bindir)
        self.durable = durable
        self.os_user = os_user or self._default_os_user()

    # -- paths and identity -------------------------------------------------------------
    @property
    def pgdata(self) -> Path:
        return self.root / "data"

    @property
    def info_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def log_file(self) -> Path:
        return self.root / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    @staticmethod
    def _default_os_user() -> str | None:
        if os.geteuid() != 0:
            return None
        for name in ("postgres", "nobody"):
            try:
                pwd.getpwnam(name)
                return name
            except KeyError:
                continue
        raise EmbeddedPostgresError("Running as root but no unprivileged user (postgres/nobody)")

    def _run(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.os_user:
            cmd = ["runuser", "-u", self.os_user, "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise EmbeddedPostgresError(
                f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc

    def _check_reachable(self) -> None:
        """The server user must traverse every parent of the data directory."""
        if not self.os_user:
            return
        for parent in [self.root, *self.root.parents]:
            probe = subprocess.run(["runuser", "-u", self.os_user, "--", "test", "-x", str(parent)])
            if probe.returncode != 0:
                raise EmbeddedPostgresError(
                    f"The Postgres server runs as '{self.os_user}' (initdb refuses root), and that "
                    f"user cannot enter {parent}. Choose a data directory it can reach, e.g. "
                    "TRACE_PG_DATA_DIR=/var/tmp/trace-pg, or `chmod o+x` that directory."
                )

    def _chown(self, path: Path) -> None:
        if self.os_user:
            pw = pwd.getpwnam(self.os_user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    # -- lifecycle ---------------------------------------------------------------------
    def info(self) -> ClusterInfo | None:
        if not self.info_file.exists():
            return None
        raw = json.loads(self.info_file.read_text())
        return ClusterInfo(port=int(raw["port"]), password=raw["password"])

    def _write_info(self, info: ClusterInfo) -> None:
        self.info_file.write_text(json.dumps({"port": info.port, "password": info.password}))
        self.info_file.chmod(0o600)

    def initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists() and self.info_file.exists()

    def init(self) -> None:
        if self.initialized():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self._check_reachable()
        if self.pgdata.exists():
            shutil.rmtree(self.pgdata)  # a half-finished earlier initdb
        self.pgdata.mkdir(mode=0o700)
        self.socket_dir.mkdir(exist_ok=True)
        for p in (self.pgdata, self.socket_dir):
            self._chown(p)
        password = secrets.token_urlsafe(24)
        pwfile = self.root / ".pwfile"
        pwfile.write_text(password + "\n")
        self._chown(pwfile)
        try:
            self._run(
                [
                    "initdb",
                    "-D",
                    str(self.pgdata),
                    "-U",
                    SUPERUSER,
                    "--pwfile",
                    str(pwfile),
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]
            )
        finally:
            pwfile.unlink(missing_ok=True)
        conf = [
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.socket_dir}'",
            "max_connections = 200",
            "shared_buffers = 256MB",
        ]
        if not self.durable:  # throwaway test clusters: durability buys nothing there
            conf += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        with (self.pgdata / "postgresql.auto.conf").open("a") as f:
            f.write("\n".join(conf) + "\n")
        self._write_info(ClusterInfo(port=free_port(), password=password))

    def running(self) -> bool:
        if not self.initialized():
            return False
        return self._run(["pg_ctl", "status", "-D", str(self.pgdata)], check=False).returncode == 0

    def start(self) -> ClusterInfo:
        self.init()
        info = self.info()
        assert info is not None
        if self.running():
            return info
        if not port_free(info.port):  # someone took our port while we were down
            info = ClusterInfo(port=free_port(), password=info.password)
            self._write_info(info)
        if self.log_file.exists():
            self._chown(self.log_file)
        else:
            self.log_file.touch()
            self._chown(self.log_file)
        proc = self._run(
            [
                "pg_ctl",
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                str(self.pgdata),
                "-l",
                str(self.log_file),
                "-o",
                f"-p {info.port}",
            ],
            check=False,
        )
        if proc.returncode != 0:
            tail = self.log_file.read_text().splitlines()[-10:] if self.log_file.exists() else []
            raise EmbeddedPostgresError(
                "Embedded Postgres did not start:\n" + "\n".join([proc.stderr.strip(), *tail])
            )
        self._ensure_database(info)
        return info

    def stop(self, mode: str = "fast") -> None:
        if self.running():
            self._run(["pg_ctl", "stop", "-D", str(self.pgdata), "-m", mode, "-w"])

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, dbname: str = DB_NAME) -> str:
        info = self.info()
        if info is None:
            raise EmbeddedPostgresError(f"No cluster initialised in {self.root}")
        return (
            f"postgresql://{SUPERUSER}:{info.password}@127.0.0.1:{info.port}/{dbname}"
            "?connect_timeout=10"
        )

    def _ensure_database(self, info: ClusterInfo) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
                    exists = conn.execute(
                        "SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)
                    ).fetchone()
                    if not exists:
                        conn.execute(f'CREATE DATABASE "{DB_NAME}"')
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def status(self) -> dict[str, object]:
        info = self.info()
        return {
            "data_dir": str(self.root),
            "bindir": str(self.bindir),
            "initialized": self.initialized(),
            "running": self.running(),
            "port": info.port if info else None,
            "os_user": self.os_user,
        }
