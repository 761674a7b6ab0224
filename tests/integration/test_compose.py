"""deploy/docker-compose.yml, checked with no Docker engine (issue 41).

The file is validated against the Compose Specification's JSON Schema (vendored under
tests/data/compose-spec), its rules are read off it (health checks, what is published, where
credentials come from), and then its Trace services are run: each service's command, with its
environment as compose would interpolate it from a .env made by deploy/init-env.sh, as a plain
process against a real Postgres (a private cluster, given the passwords and logins the postgres
service's first start makes) and moto's S3 (in place of MinIO), each started once the services
it depends on are healthy by their own health check commands. Then a DAG goes through them: an
operator on a worker writes a batch to S3, the sink loads it with its least-privilege login, and
the API's Query Service reads it back with its read-only one.

Translated from the file, and nothing else: the compose host names (postgres, minio, api) to
127.0.0.1 and the test's ports, each container's TRACE_HOME to a directory of its own, the API's
wildcard bind to loopback; the test operators are allowed (TEST_ONLY). The minio-init one-shot
(`mc`) is replaced by making its bucket, and MinIO's `mc ready` by an S3 call.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
import jsonschema
import psycopg
import pytest
import yaml
from psycopg import sql

from tests.support.servers import bearer
from tests.support.wait import wait_for
from trace_platform.db.embedded import EmbeddedPostgres, free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
SCHEMA = ROOT / "tests/data/compose-spec/compose-spec.json"
SERVICES = {"postgres", "minio", "minio-init", "api", "worker", "scheduler", "sink", "delivery"}
TRACE_IMAGE = "trace-platform:lite"
API_PORT = 8765  # the API's port in its container (Settings.api_port's default)
# The only settings the test adds: the DAG below uses a test operator (publish_rows).
TEST_ONLY = {"TRACE_OPERATOR_REGISTRY": "testing"}
# Names of settings that hold a credential (an access key's id is a user name, not one).
CREDENTIAL = re.compile(r"PASSWORD|SECRET|TOKEN|_KEY$|DSN")

# Compose interpolation: $$, $NAME, ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?err}.
_VAR = re.compile(
    r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))"
)


class Unset(Exception):
    """A ${NAME:?message} whose variable is not set: compose refuses to start."""


def interpolate(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name, op, arg = m.group(2) or m.group(5), m.group(3), m.group(4)
        given = name in env and (bool(env[name]) or not (op or "").startswith(":"))
        if op in (":-", "-"):
            return env[name] if given else arg
        if op in (":?", "?") and not given:
            raise Unset(f"{name}: {arg}")
        return env.get(name, "")

    return _VAR.sub(sub, value)


class KeysOf(dict[str, str]):
    """An environment with every variable set, recording the names asked for."""

    def __init__(self, into: set[str]) -> None:
        super().__init__()
        self.into = into

    def __contains__(self, name: object) -> bool:
        self.into.add(str(name))
        return True

    def __getitem__(self, name: str) -> str:
        return "x"

    def get(self, name: str, default: object = None) -> str:  # type: ignore[override]
        self.into.add(name)
        return "x"


def dotenv(path: Path) -> dict[str, str]:
    lines = (ln.strip() for ln in path.read_text().splitlines())
    return dict(ln.split("=", 1) for ln in lines if ln and not ln.startswith("#"))


def raw() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())  # anchors and << merges resolved
    assert isinstance(doc, dict)
    return doc


def init_env(path: Path) -> dict[str, str]:
    out = subprocess.run(
        ["sh", str(DEPLOY / "init-env.sh"), str(path)], capture_output=True, text=True, check=True
    )
    assert str(path) in out.stdout
    return dotenv(path)


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the KEY=VALUE form
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def is_trace(service: dict[str, Any]) -> bool:
    return service.get("image") == TRACE_IMAGE


# -- the file --------------------------------------------------------------------------------
def test_the_file_follows_the_compose_specification(tmp_path: Path) -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    doc = raw()
    for form in (doc, interpolate(doc, init_env(tmp_path / ".env"))):
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(form)]
        assert errors == []
    assert set(doc["services"]) == SERVICES
    # Guard the guard: the schema refuses what compose refuses.
    broken = {"services": {"api": {"image": "x", "healthcheck": {"test": 1, "intervall": "5s"}}}}
    assert len(list(validator.iter_errors(broken))) == 2


def test_every_service_has_a_health_check_and_waits_for_what_it_needs() -> None:
    services = raw()["services"]
    for name, svc in services.items():
        if svc.get("restart") == "no":  # a one-shot: others wait for it to complete instead
            assert name == "minio-init"
            continue
        test = svc.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), name
        assert not svc["healthcheck"].get("disable"), name
    assert services["api"]["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "minio-init": {"condition": "service_completed_successfully"},
    }
    assert services["minio-init"]["depends_on"] == {"minio": {"condition": "service_healthy"}}
    for name in SERVICES - {"postgres", "minio", "minio-init", "api"}:
        assert services[name]["depends_on"] == {"api": {"condition": "service_healthy"}}, name
        assert is_trace(services[name]), name
    # The Trace image runs `trace`: a service's command is the CLI's arguments.
    assert re.search(r'^ENTRYPOINT \["trace"\]$', (DEPLOY / "Dockerfile").read_text(), re.M)


def test_only_the_api_is_published_and_on_loopback_by_default() -> None:
    services = raw()["services"]
    published = {n: s["ports"] for n, s in services.items() if s.get("ports")}
    assert published == {"api": [f"${{TRACE_API_BIND:-127.0.0.1}}:{API_PORT}:{API_PORT}"]}
    assert not any("expose" in s or "network_mode" in s for s in services.values())
    # The exchange listener is the API's second port, reached by name on the compose network.
    api_env = env_of(services["api"])
    assert api_env["TRACE_EXCHANGE_PORT"] == "8766"
    assert env_of(services["worker"])["TRACE_EXCHANGE_URL"] == "http://api:8766"
    assert env_of(services["worker"])["TRACE_API_URL"] == f"http://api:{API_PORT}"


def test_no_credential_is_a_literal_and_each_is_generated(tmp_path: Path) -> None:
    doc = raw()
    first = init_env(tmp_path / "a.env")
    second = init_env(tmp_path / "b.env")
    assert (tmp_path / "a.env").stat().st_mode & 0o777 == 0o600
    assert set(first) == set(second) and len(first) == 7
    assert all(len(v) >= 44 and first[k] != second[k] for k, v in first.items())
    # A second run keeps the file: Postgres and MinIO took the first passwords.
    assert init_env(tmp_path / "a.env") == first

    for name, svc in doc["services"].items():
        for key, value in env_of(svc).items():
            if not CREDENTIAL.search(key):
                continue
            secrets_in = re.findall(r"\$\{(\w+):\?[^}]*\}", value)
            assert secrets_in, f"{name}.{key} is a literal credential"
            assert set(secrets_in) <= set(first), f"{name}.{key}: not made by init-env.sh"
            if "DSN" in key:  # the password, and only it, is the variable
                assert re.fullmatch(r"postgresql://\w+:\$\{\w+:\?[^}]*\}@[\w.:]+/\w+", value)
    # Without the generated file compose refuses to start, naming the step.
    with pytest.raises(Unset, match=re.escape("run deploy/init-env.sh first")):
        interpolate(doc, {})
    # Every variable the file uses is generated, or is the API's bind address.
    used: set[str] = set()
    interpolate(doc, KeysOf(used))
    assert used == set(first) | {"TRACE_API_BIND"}


# -- the services, running -------------------------------------------------------------------
@dataclass
class Stack:
    compose: dict[str, Any]
    tmp: Path
    pg: EmbeddedPostgres
    s3_url: str
    hosts: dict[str, str] = field(default_factory=dict)
    procs: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)
    logs: list[Path] = field(default_factory=list)

    def translate(self, text: str) -> str:
        """A compose host:port in a URL or DSN -> where the test runs it."""
        for src, dst in self.hosts.items():
            text = re.sub(rf"(?<=[@/]){re.escape(src)}(?=/|$)", dst, text)
        return text

    def env(self, name: str) -> dict[str, str]:
        svc = self.compose["services"][name]
        env = {k: self.translate(v) for k, v in env_of(svc).items()}
        if "TRACE_HOME" in env:  # each container has its own filesystem
            env["TRACE_HOME"] = str(self.tmp / "home" / name)
        if name == "api":  # its own network namespace in Docker: here, loopback and free ports
            env["TRACE_API_HOST"] = "127.0.0.1"
            env["TRACE_API_PORT"] = self.hosts[f"api:{API_PORT}"].split(":")[1]
            port = env["TRACE_EXCHANGE_PORT"]
            env["TRACE_EXCHANGE_PORT"] = self.hosts[f"api:{port}"].split(":")[1]
        base = {k: v for k, v in os.environ.items() if not k.startswith(("TRACE_", "AWS_", "PG"))}
        return {**base, **env, **TEST_ONLY}

    def argv(self, words: list[str]) -> list[str]:
        """A command of the Trace image (or a health check's) as this machine runs it."""
        if words[0] == "python":
            return [sys.executable, *words[1:]]
        return [str(Path(sys.executable).with_name("trace")), *words]

    def start(self, name: str) -> None:
        svc = self.compose["services"][name]
        replicas = svc.get("deploy", {}).get("replicas", 1)
        for i in range(replicas):
            log = self.tmp / f"{name}-{i}.log"
            self.logs.append(log)
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    self.argv(svc["command"]), env=self.env(name), stdout=out, stderr=out
                )
            self.procs.setdefault(name, []).append(proc)

    def health_check(self, name: str) -> Callable[[], tuple[bool, str]]:
        """The service's healthcheck.test, run as this machine can."""
        test = self.compose["services"][name]["healthcheck"]["test"]
        assert test[0] == "CMD", (name, test)
        words = test[1:]
        if words[0] == "pg_isready":  # in the container: its socket; here: the cluster's port
            host, port = self.hosts["postgres:5432"].split(":")
            argv = [str(self.pg.bindir / "pg_isready"), *words[1:], "--host", host, "--port", port]
            return lambda: self._run(argv, os.environ.copy())
        if words == ["mc", "ready", "local"]:  # MinIO's readiness: here, moto's S3 answers
            return lambda: (bool(self.s3().list_buckets()), "")
        assert is_trace(self.compose["services"][name]), name
        return lambda: self._run(self.argv(words), self.env(name))

    @staticmethod
    def _run(argv: list[str], env: dict[str, str]) -> tuple[bool, str]:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        return out.returncode == 0, out.stdout + out.stderr

    def wait_healthy(self, name: str, timeout: float = 60) -> None:
        check, last = self.health_check(name), ""
        deadline = time.monotonic() + timeout
        while True:
            for proc in self.procs.get(name, []):
                assert proc.poll() is None, f"{name} exited {proc.returncode}: {self.tail()}"
            ok, last = check()
            if ok:
                return
            assert time.monotonic() < deadline, f"{name} not healthy: {last}\n{self.tail()}"
            time.sleep(1.0)

    def wait_listening(self, name: str, url: str, timeout: float = 120) -> None:
        """Until `url` answers: a check command costs a Python start, so it is run once the
        service can pass it rather than every second of the service's own start."""

        def answers() -> bool:
            for proc in self.procs[name]:
                assert proc.poll() is None, f"{name} exited {proc.returncode}: {self.tail()}"
            try:
                return httpx.get(url, timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, timeout, f"{name} listening")

    def s3(self) -> Any:
        env = self.env("api")
        return boto3.client(
            "s3",
            endpoint_url=env["TRACE_S3_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id=env["TRACE_S3_ACCESS_KEY_ID"],
            aws_secret_access_key=env["TRACE_S3_SECRET_ACCESS_KEY"],
        )

    def tail(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in self.logs if p.exists())

    def stop(self) -> None:
        procs = [p for ps in self.procs.values() for p in ps]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def postgres_first_start(stack: Stack, env: dict[str, str]) -> None:
    """What the postgres image does with an empty volume, on the test's own cluster: the
    superuser's password and database from POSTGRES_*, then the init scripts it mounts."""
    pg_env = env_of(stack.compose["services"]["postgres"])
    assert pg_env["POSTGRES_USER"] == "trace" and pg_env["POSTGRES_DB"] == "trace"
    with psycopg.connect(stack.pg.dsn("trace"), autocommit=True) as conn:  # initdb's password
        conn.execute(
            sql.SQL("ALTER ROLE trace PASSWORD {}").format(sql.Literal(pg_env["POSTGRES_PASSWORD"]))
        )
    mounts = stack.compose["services"]["postgres"]["volumes"]
    scripts = [m.split(":")[0] for m in mounts if "/docker-entrypoint-initdb.d/" in m]
    assert scripts == ["./postgres-init.sh"]
    host, port = stack.hosts["postgres:5432"].split(":")
    for script in scripts:
        subprocess.run(
            ["sh", str(DEPLOY / script)],
            env={
                **os.environ,
                **pg_env,
                "PGHOST": host,
                "PGPORT": port,
                "PGPASSWORD": pg_env["POSTGRES_PASSWORD"],
            },
            check=True,
            capture_output=True,
        )


def minio_init(stack: Stack) -> None:
    """The one-shot's work: its bucket (moto takes any key, so its MinIO user is not made)."""
    svc = stack.compose["services"]["minio-init"]
    script = svc["command"][0]
    assert 'mc mb --ignore-existing "local/$TRACE_S3_BUCKET"' in script
    bucket = env_of(svc)["TRACE_S3_BUCKET"]
    assert bucket == env_of(stack.compose["services"]["api"])["TRACE_S3_BUCKET"]
    stack.s3().create_bucket(Bucket=bucket)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    from moto.server import ThreadedMotoServer

    # A moto server and a Postgres cluster of its own, as the compose stack has: its bucket
    # and roles are the file's own names, which the session's shared ones may also hold.
    s3_port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    moto.start()
    # Under /tmp, traversable: as root the cluster runs as an unprivileged user (conftest's way).
    pg_root = Path(tempfile.mkdtemp(prefix="trace-compose-pg-", dir="/tmp"))
    pg_root.chmod(0o755)
    pg = EmbeddedPostgres(pg_root / "cluster", durable=False)
    pg.start()
    env = init_env(tmp_path / ".env")
    s = Stack(interpolate(raw(), env), tmp_path, pg, f"http://127.0.0.1:{s3_port}")
    s.hosts = {
        "postgres:5432": f"127.0.0.1:{pg.info().port}",
        "minio:9000": f"127.0.0.1:{s3_port}",
        f"api:{API_PORT}": f"127.0.0.1:{free_port()}",
        "api:8766": f"127.0.0.1:{free_port()}",
    }
    try:
        postgres_first_start(s, env)
        yield s
    finally:
        s.stop()
        pg.destroy()
        shutil.rmtree(pg_root, ignore_errors=True)
        moto.stop()


DAG = """
name: compose_check
jobs:
  rule:
    operator: publish_rows
    buffer_outputs: [landed]
    config: {dataset: landed, batches: [[{k: a, n: 1}, {k: b, n: 2}]]}
buffered:
  - name: landed
    columns: [{name: k, type: text}, {name: n, type: int64}]
    unique_key: [k]
    writers: [compose_check.rule]
"""


def test_the_services_come_up_healthy_together_and_run_a_dag(stack: Stack) -> None:
    services = stack.compose["services"]
    done: set[str] = set()

    def ready(dep: str, condition: str) -> None:
        for up, cond in services[dep].get("depends_on", {}).items():
            if up not in done:
                ready(up, cond["condition"])
        if condition == "service_completed_successfully":
            minio_init(stack)
        else:
            assert condition == "service_healthy"
            if dep == "api":
                stack.wait_listening("api", f"http://{stack.hosts[f'api:{API_PORT}']}/healthz")
            stack.wait_healthy(dep)
        done.add(dep)

    # As compose starts them: each once what it depends on is ready (the API first: the
    # others wait for it).
    pending = sorted(
        (n for n in services if is_trace(services[n])),
        key=lambda n: any(is_trace(services[d]) for d in services[n]["depends_on"]),
    )
    for name in pending:
        for dep, cond in services[name]["depends_on"].items():
            if dep not in done:
                ready(dep, cond["condition"])
        stack.start(name)
    assert len(stack.procs["worker"]) == services["worker"]["deploy"]["replicas"] == 2

    # The API made the Lite admin's key on its first start (in its own home).
    key = (stack.tmp / "home/api/admin.key").read_text().strip()
    url = f"http://{stack.hosts[f'api:{API_PORT}']}"
    api = httpx.Client(base_url=url, headers=bearer(key), timeout=30)
    assert api.get("/v1/dags").status_code == 200
    assert httpx.get(f"{url}/v1/dags").status_code == 401  # auth required: no Lite default
    assert api.post("/v1/dags", json={"yaml": DAG}).status_code == 201
    assert api.post("/v1/dags/compose_check/trigger", json={}).status_code == 201

    def loaded() -> list[dict[str, Any]] | None:
        recs = api.get("/v1/buffers").json()
        assert all(r["status"] != "dead" for r in recs), recs
        return recs if recs and all(r["status"] == "loaded" for r in recs) else None

    recs = wait_for(loaded, 90, "the worker's batch loaded by the sink")
    assert [r["rows_loaded"] for r in recs] == [2]
    # The batch went through the object store's bucket, not a local directory.
    bucket = env_of(services["api"])["TRACE_S3_BUCKET"]
    assert stack.s3().list_objects_v2(Bucket=bucket)["KeyCount"] > 0
    got = api.post("/v1/query", json={"sql": "SELECT k, n FROM landed ORDER BY k"})
    assert got.status_code == 200, got.text
    assert got.json()["rows"] == [["a", 1], ["b", 2]]

    # The data landed as the sink's least-privilege login, not the state superuser.
    with psycopg.connect(stack.env("api")["TRACE_STATE_DSN"]) as conn:
        owners = conn.execute(
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname LIKE 'dataset_%'"
        ).fetchall()
    assert owners == [("trace_sink",)]

    # Then every service healthy at once by its own check (run side by side), after that work,
    # and every process still running.
    checked = [n for n in services if n != "minio-init"]
    with ThreadPoolExecutor(len(checked)) as pool:
        list(pool.map(lambda n: stack.wait_healthy(n, timeout=60), checked))
    for procs in stack.procs.values():
        assert all(p.poll() is None for p in procs), stack.tail()
