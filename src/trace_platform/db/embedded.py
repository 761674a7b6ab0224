"""An embedded Postgres cluster in a data directory: the Lite default and the test harness.

The cluster listens on 127.0.0.1 only, on a free port recorded in the data directory, and is
reused across runs. As root it runs as an unprivileged system user, since initdb refuses root.

No local user gets in without a password: every pg_hba line asks for scram-sha-256 (the unix
socket too; a cluster initialised with `trust` by an older Trace is rewritten and reloaded on
start), the socket directory is 0700 and owned by the server user, and the cluster root is
root-owned 0710 with the server user's group (0700 when not run as root), so that only root and
the server user get in; `cluster.json` (the passwords) is 0600 and owned by the invoking user.

Besides the superuser the cluster has two least-privilege logins, each with its own random
password: `trace_query`, the Query Service's, in the NOLOGIN group `trace_published_read`
(migration 0009 grants it SELECT on the published data only), read-only by default; and
`trace_sink`, the hot_window sink's, in the NOLOGIN group `trace_sink_write` (migration 0010:
it may make `dataset_<hex>` schemas through one function, create tables in them and views in
`published`, and own what it creates; nothing of the state tables, no CREATE on the database).
"""

from __future__ import annotations

import base64
import fcntl
import glob
import hashlib
import hmac
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
from psycopg import sql

DB_NAME = "trace"
SUPERUSER = "trace"
READER = "trace_query"  # the Query Service's login
READ_GROUP = "trace_published_read"  # NOLOGIN; its grants come from migration 0009
SINK = "trace_sink"  # the hot_window sink's data login
SINK_GROUP = "trace_sink_write"  # NOLOGIN; its grants come from migration 0010
_LEAST = "NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"

# pg_hba methods that let a local user in without a password.
_WEAK_METHODS = {"trust", "peer", "ident"}
_HBA_METHODS = _WEAK_METHODS | {
    "reject",
    "scram-sha-256",
    "md5",
    "password",
    "gss",
    "sspi",
    "pam",
    "ldap",
    "radius",
    "cert",
}

# Clusters this process started, by port: lets a DSN to one of them find its other logins.
_SERVING: dict[int, EmbeddedPostgres] = {}


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
    """Nobody else listens on `port`. SO_REUSEADDR as Postgres binds it: the TIME_WAIT sockets of
    our own server's last connections do not make the port taken."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _local(params: dict[str, object]) -> bool:
    """A DSN (as a dict) to this machine's loopback, where the embedded clusters listen."""
    return str(params.get("host") or params.get("hostaddr") or "") in ("127.0.0.1", "localhost")


def scram_verifier(password: str, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier Postgres stores for a password (RFC 5802/7677), so the
    password itself never reaches the server (nor its log)."""
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def harden_hba(text: str) -> str:
    """pg_hba.conf with every passwordless method (trust, peer, ident) replaced by scram-sha-256."""
    out = []
    for line in text.splitlines(keepends=True):
        body, hash_, comment = line.partition("#")
        fields = body.split()
        if fields and fields[0].startswith(("local", "host")):
            method = next((i for i in range(3, len(fields)) if fields[i] in _HBA_METHODS), None)
            if method is not None and fields[method] in _WEAK_METHODS:
                fields = [*fields[:method], "scram-sha-256"]  # peer/ident options go too
                line = "\t".join(fields) + (f"  #{comment}" if hash_ else "\n")
        out.append(line)
    return "".join(out)


@dataclass
class ClusterInfo:
    port: int
    password: str
    reader_password: str = ""  # empty in a cluster.json written by an older Trace
    sink_password: str = ""  # likewise

    @staticmethod
    def read(path: Path) -> ClusterInfo | None:
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        return ClusterInfo(
            port=int(raw["port"]),
            password=raw["password"],
            reader_password=raw.get("reader_password", ""),
            sink_password=raw.get("sink_password", ""),
        )

    def login_dsn(self, user: str, dbname: str = DB_NAME) -> str | None:
        """The DSN of the least-privilege login `user` (READER or SINK) on `dbname`; None when
        this cluster.json has no password for it yet (written by an older Trace)."""
        password = {READER: self.reader_password, SINK: self.sink_password}[user]
        if not password:
            return None
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1",
            port=self.port,
            dbname=dbname,
            user=user,
            password=password,
            connect_timeout=10,
        )

    def superuser_of(self, dsn: str) -> bool:
        """`dsn` is this cluster's superuser login (same local port, same password)."""
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        if not _local(params):
            return False
        return (
            str(params.get("port") or 5432) == str(self.port)
            and str(params.get("user") or "") == SUPERUSER
            and hmac.compare_digest(str(params.get("password") or ""), self.password)
        )


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
            os.chown(path, pw.pw_uid, pw.pw_gid, follow_symlinks=False)

    def _secure_dirs(self) -> None:
        """Only root and the server user get into the cluster root (root-owned, so the server
        user cannot swap what root reads or writes there); only the server user gets into the
        socket directory. Applied on every start, so older, world-traversable layouts tighten."""
        if self.os_user:
            gid = pwd.getpwnam(self.os_user).pw_gid
            os.chown(self.root, os.geteuid(), gid)
            self.root.chmod(0o710)
        else:
            self.root.chmod(0o700)
        if self.socket_dir.is_symlink():
            self.socket_dir.unlink()
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self._chown(self.socket_dir)
        self.socket_dir.chmod(0o700)
        for f in (self.info_file, self.log_file):
            if f.exists() and not f.is_symlink():
                f.chmod(0o600)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One process at a time initialises, starts and sets the logins of this cluster."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- lifecycle ---------------------------------------------------------------------
    def info(self) -> ClusterInfo | None:
        return ClusterInfo.read(self.info_file)

    def _write_info(self, info: ClusterInfo) -> None:
        """Written whole (a temp file renamed over), 0600 from the first byte."""
        data = json.dumps(
            {
                "port": info.port,
                "password": info.password,
                "reader_password": info.reader_password,
                "sink_password": info.sink_password,
            }
        )
        tmp = self.root / f".cluster.json.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, self.info_file)

    def initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists() and self.info_file.exists()

    def init(self) -> None:
        with self._locked():
            self._init()

    def _init(self) -> None:
        if self.initialized():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self._secure_dirs()
        self._check_reachable()
        if self.pgdata.exists():
            shutil.rmtree(self.pgdata)  # a half-finished earlier initdb
        self.pgdata.mkdir(mode=0o700)
        self._chown(self.pgdata)
        password = secrets.token_urlsafe(24)
        pwfile = self.root / ".pwfile"
        pwfile.unlink(missing_ok=True)
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
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
                    "--auth-local=scram-sha-256",
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
            "unix_socket_permissions = 0700",
            "password_encryption = 'scram-sha-256'",
            "max_connections = 200",
            "shared_buffers = 256MB",
        ]
        if not self.durable:  # throwaway test clusters: durability buys nothing there
            conf += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        with (self.pgdata / "postgresql.auto.conf").open("a") as f:
            f.write("\n".join(conf) + "\n")
        self._write_info(
            ClusterInfo(
                port=free_port(),
                password=password,
                reader_password=secrets.token_urlsafe(24),
                sink_password=secrets.token_urlsafe(24),
            )
        )

    def _harden_hba(self) -> bool:
        """Rewrites passwordless pg_hba lines (a cluster initialised with `trust` by an older
        Trace) to scram-sha-256; True when something changed. Never follows a symlink: the file
        belongs to the server user."""
        fd = os.open(self.pgdata / "pg_hba.conf", os.O_RDWR | os.O_NOFOLLOW)
        with os.fdopen(fd, "r+") as f:
            text = f.read()
            hardened = harden_hba(text)
            if hardened == text:
                return False
            f.seek(0)
            f.write(hardened)
            f.truncate()
        return True

    def running(self) -> bool:
        if not self.initialized():
            return False
        return self._run(["pg_ctl", "status", "-D", str(self.pgdata)], check=False).returncode == 0

    def start(self) -> ClusterInfo:
        with self._locked():
            self._init()
            self._secure_dirs()
            info = self.info()
            assert info is not None
            if not info.reader_password or not info.sink_password:  # an older cluster.json
                info = replace(
                    info,
                    reader_password=info.reader_password or secrets.token_urlsafe(24),
                    sink_password=info.sink_password or secrets.token_urlsafe(24),
                )
                self._write_info(info)
            hba_changed = self._harden_hba()
            if self.running():
                if hba_changed:
                    self._run(["pg_ctl", "reload", "-D", str(self.pgdata)])
            else:
                info = self._start_server(info)
            self._ensure_database(info)
            _SERVING[info.port] = self
            return info

    def _start_server(self, info: ClusterInfo) -> ClusterInfo:
        if not port_free(info.port):  # someone took our port while we were down
            info = replace(info, port=free_port())
            self._write_info(info)
        if not self.log_file.exists():
            fd = os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            os.close(fd)
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
        return info

    def stop(self, mode: str = "fast") -> None:
        if self.running():
            self._run(["pg_ctl", "stop", "-D", str(self.pgdata), "-m", mode, "-w"])

    def destroy(self) -> None:
        self.stop("immediate")
        for port, pg in list(_SERVING.items()):
            if pg.root == self.root:
                del _SERVING[port]
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, dbname: str = DB_NAME) -> str:
        info = self.info()
        if info is None:
            raise EmbeddedPostgresError(f"No cluster initialised in {self.root}")
        return (
            f"postgresql://{SUPERUSER}:{info.password}@127.0.0.1:{info.port}/{dbname}"
            "?connect_timeout=10"
        )

    def reader_dsn(self, dbname: str = DB_NAME) -> str:
        """The Query Service's login: SELECT on the published data of `dbname` only (the grants
        are migration 0009's, per database), read-only transactions by default."""
        return self._login_dsn(READER, dbname)

    def sink_dsn(self, dbname: str = DB_NAME) -> str:
        """The hot_window sink's login: it makes `dataset_<hex>` schemas through migration
        0010's function only, tables in them and views in `published`, and owns what it makes;
        it cannot reach the state tables of `dbname` (the grants are per database)."""
        return self._login_dsn(SINK, dbname)

    def _login_dsn(self, user: str, dbname: str) -> str:
        info = self.info()
        dsn = info.login_dsn(user, dbname) if info is not None else None
        if dsn is None:
            raise EmbeddedPostgresError(
                f"No {user} login in {self.root} yet: start the cluster once with this version"
            )
        return dsn

    @staticmethod
    def serving(dsn: str) -> EmbeddedPostgres | None:
        """The cluster this process started that `dsn` points at (any database of it), if any."""
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        if not _local(params):
            return None
        try:
            port = int(params.get("port") or 5432)
        except ValueError:
            return None
        pg = _SERVING.get(port)
        info = pg.info() if pg is not None else None
        return pg if info is not None and info.port == port else None

    @staticmethod
    def logins_of(dsn: str) -> ClusterInfo | None:
        """The logins (cluster.json) of the embedded cluster whose superuser login `dsn` is: one
        this process started, else the one the server says it runs from (its data directory;
        only a superuser may ask), when this process can read that cluster.json and it holds the
        same port and superuser password. None otherwise (another server, another login)."""
        pg = EmbeddedPostgres.serving(dsn)
        info = pg.info() if pg is not None else None
        if info is not None:
            return info
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        if str(params.get("user") or "") != SUPERUSER or not params.get("password"):
            return None
        if not _local(params):
            return None
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
                row = conn.execute("SELECT current_setting('data_directory')").fetchone()
            info = ClusterInfo.read(Path(str(row[0])).parent / "cluster.json") if row else None
        except (psycopg.Error, OSError, ValueError, KeyError, TypeError):
            return None
        return info if info is not None and info.superuser_of(dsn) else None

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
                    # Temporary tables are a PUBLIC default: the reader gets none of them.
                    conn.execute(f'REVOKE TEMPORARY ON DATABASE "{DB_NAME}" FROM PUBLIC')
                    self._ensure_logins(conn, info)
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    @staticmethod
    def _ensure_logins(conn: psycopg.Connection[tuple[object, ...]], info: ClusterInfo) -> None:
        """The NOLOGIN groups (also created by migrations 0009 and 0010, whichever runs first)
        and the least-privilege logins in them, with the passwords in cluster.json: the Query
        Service's (read-only by default) and the sink's. Roles are cluster-wide."""
        least = sql.SQL(_LEAST)
        for group, login, password in (
            (READ_GROUP, READER, info.reader_password),
            (SINK_GROUP, SINK, info.sink_password),
        ):
            for role, kind in ((group, sql.SQL("NOLOGIN")), (login, sql.SQL("LOGIN"))):
                if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                    continue
                # A migration on another connection may create it meanwhile.
                with suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
                    conn.execute(sql.SQL("CREATE ROLE {} {}").format(sql.Identifier(role), kind))
            conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN {}").format(sql.Identifier(group), least))
            conn.execute(
                sql.SQL("ALTER ROLE {} LOGIN INHERIT {} PASSWORD {}").format(
                    sql.Identifier(login), least, sql.Literal(scram_verifier(password))
                )
            )
            conn.execute(
                sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(login))
            )
        conn.execute(
            sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(
                sql.Identifier(READER)
            )
        )

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
