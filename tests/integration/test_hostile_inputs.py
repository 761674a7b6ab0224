"""Hostile input at the gateway (issue 10): a table of requests a client with a no-role API key
(or none, or the internal endpoints' caller) can send, across the Query Service, DAG files,
trigger configs, secrets and internal bodies. Each answers its expected status, in Trace's error
shape, with a message that says what was wrong. After the whole table the stack still answers a
normal query within its usual time, and nothing stored changed.

One stack (database, Services, API on a real socket) serves the whole module; the last test
sends every row again and then compares every state table, the object store and the files rows
try to write with the snapshot taken before the first row."""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from tests.support.dags import admin, three_jobs, user
from tests.support.datasets import commit_parquet
from trace_platform.api.gateway import MAX_BODY_BYTES
from trace_platform.config import Settings
from trace_platform.db.embedded import free_port
from trace_platform.lite.stack import ApiServer
from trace_platform.services import Services

# A DAG the no-role user deploys herself before the table: she owns it, so she may trigger it
# and read what it publishes; everything else in the org is invisible to her.
OWN_DAG = """
name: mallory_dag
jobs:
  ingest:
    operator: noop
    outputs: [{backend: parquet}]
publish:
  - {job: ingest, output_index: 0, dataset: mallory_blocks}
triggers:
  webhooks:
    - {name: poke}
"""
NORMAL_QUERY = "SELECT count(*) AS n, max(block_number) AS top FROM mallory_blocks"
NORMAL_ROWS = [[10, 9]]


# -- bodies ------------------------------------------------------------------------------------
def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def chunked(total: int, chunk: int = 64 * 1024) -> Callable[[], Iterator[bytes]]:
    """A body sent with Transfer-Encoding: chunked (no Content-Length), `total` bytes."""

    def gen() -> Iterator[bytes]:
        block = b" " * chunk
        for _ in range(total // chunk):
            yield block

    return gen


def alias_bomb(levels: int = 9) -> str:
    """Each level repeats the one below ten times: ~500 bytes of YAML, 10**9 nodes expanded."""
    lines = ['  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 10)
        lines.append(f"  a{i}: &a{i} [{refs}]")
    return (
        "name: bomb\njobs:\n  j:\n    operator: noop\n    config:\n"
        + "\n".join("    " + line for line in lines)
        + "\n"
    )


def dag(name: str = "hostile", *, operator: str = "noop", schedule: str | None = None) -> str:
    text = f"name: {json.dumps(name)}\njobs:\n  j: {{operator: {operator}}}\n"
    if schedule is not None:
        text += f"triggers:\n  cron:\n    - {{name: tick, schedule: {json.dumps(schedule)}}}\n"
    return text


@dataclass(frozen=True)
class Row:
    method: str
    path: str
    status: int
    fragment: str  # in the error message (or, for a 2xx, in the body)
    json: Any = None
    content: bytes | Callable[[], Iterator[bytes]] | None = None
    who: str = "user"  # user (no roles) | anon (no key) | internal | internal-wrong | none
    headers: dict[str, str] = field(default_factory=dict)


def row(id_: str, method: str, path: str, status: int, fragment: str, **kw: Any) -> Any:
    return pytest.param(Row(method, path, status, fragment, **kw), id=id_)


def query(id_: str, status: int, fragment: str, body: dict[str, Any]) -> Any:
    """POST /v1/query with `body`, as the no-role user."""
    return row(id_, "POST", "/v1/query", status, fragment, json=body)


def dag_file(id_: str, status: int, fragment: str, yaml: Any) -> Any:
    """POST /v1/dags with `yaml` as the DAG file, as the no-role user."""
    return row(id_, "POST", "/v1/dags", status, fragment, json={"yaml": yaml})


def trigger(id_: str, status: int, fragment: str, **kw: Any) -> Any:
    """POST /v1/dags/mallory_dag/trigger (her own DAG), as the no-role user."""
    return row(id_, "POST", "/v1/dags/mallory_dag/trigger", status, fragment, **kw)


JSON = {"Content-Type": "application/json"}
LEASE = {"task_id": str(uuid.UUID(int=1)), "attempt": 1, "lease_token": str(uuid.UUID(int=2))}
# A fenced call's lease reference, as the wire carries it: query string and header.
FENCED = f"task_id={LEASE['task_id']}&attempt=1"
TOKEN = {"X-Lease-Token": LEASE["lease_token"]}

TABLE = [
    # -- the Query Service, as the no-role user -------------------------------------------
    query("query-bad-sql", 422, "bad SQL", {"sql": "SELEC 1"}),
    query("query-two-statements", 422, "one statement", {"sql": "SELECT 1; SELECT 2"}),
    query(
        "query-table-function-file",
        422,
        "read_csv",
        {"sql": "SELECT * FROM read_csv('/etc/passwd')"},
    ),
    query("query-file-path-as-table", 404, "/etc/passwd", {"sql": "SELECT * FROM '/etc/passwd'"}),
    query(
        "query-postgres-scan-to-any-host",
        422,
        "postgres_scan",
        {"sql": "SELECT * FROM postgres_scan('host=10.9.9.9 port=5432', 'public', 't')"},
    ),
    query("query-setting", 422, "not allowed", {"sql": "SELECT current_setting('allowed_paths')"}),
    query(
        "query-setting-inside-a-lambda",
        422,
        "not allowed",
        {"sql": "SELECT list_transform([1], x -> current_setting('memory_limit'))"},
    ),
    query(
        "query-table-function-by-name",
        422,
        "not allowed",
        {"sql": "SELECT * FROM query_table('duckdb_settings')"},
    ),
    query(
        "query-secret-lookup",
        422,
        "not allowed",
        {"sql": "SELECT which_secret('s3://bucket/x', 's3')"},
    ),
    query("query-view-definition", 422, "not allowed", {"sql": "SELECT pg_get_viewdef('x')"}),
    query(
        "query-binds-sql-text",
        422,
        "not allowed",
        {"sql": "SELECT json_serialize_sql('SELECT * FROM duckdb_settings()')"},
    ),
    query("query-set", 422, "only SELECT", {"sql": "SET threads = 1"}),
    query(
        "query-copy-to-file",
        422,
        "only SELECT",
        {"sql": "COPY (SELECT 1) TO '/tmp/trace-hostile.csv'"},
    ),
    query("query-attach", 422, "only SELECT", {"sql": "ATTACH '/tmp/x.db' AS x"}),
    query(
        "query-qualified-name", 422, "qualified names", {"sql": "SELECT * FROM main.mallory_blocks"}
    ),
    query(
        "query-unreadable-dataset-answers-like-unknown",
        404,
        "that you can read",
        {"sql": "SELECT * FROM hello_raw"},
    ),
    query(
        "query-huge-string-result",
        422,
        "larger than",
        {"sql": "SELECT repeat('x', 30000000) AS s", "max_rows": 1},
    ),
    query("query-sql-over-its-length-limit", 422, "100000", {"sql": "SELECT 1 " + " " * 100_000}),
    query(
        "query-huge-param-value",
        200,
        "1500000",
        {"sql": "SELECT length($s) AS n", "params": {"s": "x" * 1_500_000}},
    ),
    query("query-param-of-wrong-type", 422, "params", {"sql": "SELECT 1", "params": {"a": [1]}}),
    query("query-sql-not-a-string", 422, "sql", {"sql": 123}),
    query("query-max-rows-not-a-number", 422, "max_rows", {"sql": "SELECT 1", "max_rows": "ten"}),
    query(
        "query-negative-timeout", 422, "timeout_seconds", {"sql": "SELECT 1", "timeout_seconds": -1}
    ),
    row(
        "query-nan-timeout",
        "POST",
        "/v1/query",
        422,
        "invalid JSON",
        content=b'{"sql": "SELECT 1", "timeout_seconds": NaN}',
        headers=JSON,
    ),
    query(
        "query-absurd-timeout-is-capped",
        200,
        '"rows":[[1]]',
        {"sql": "SELECT 1", "timeout_seconds": 1e308, "max_rows": 10**30},
    ),
    query("query-neither-sql-nor-saved", 422, "exactly one of sql or saved", {"params": {}}),
    query("query-saved-path-traversal", 404, "no saved query", {"saved": "../../../etc/passwd"}),
    query("query-unknown-format", 422, "format", {"sql": "SELECT 1", "format": "xlsx"}),
    # -- DAG files (POST /v1/dags), as the no-role user --------------------------------------
    dag_file("dag-alias-bomb", 422, "aliases are expanded", alias_bomb()),
    dag_file("dag-100k-deep-yaml", 422, "deeper than 64 levels", "[" * 100_000),
    dag_file("dag-document-over-the-loader-limit", 422, "262,144", "# " + "x" * 300_000 + "\n"),
    dag_file("dag-2mb-document", 422, "1048576", "#" * 2_000_000),
    dag_file("dag-name-with-quote-and-semicolon", 422, "name", dag("x'; DROP TABLE dags; --")),
    dag_file("dag-name-path-traversal", 422, "name", dag("../../etc")),
    dag_file("dag-unknown-operator", 422, "unknown operator 'rm_rf'", dag(operator="rm_rf")),
    dag_file("dag-bad-cron", 422, "not a valid cron expression", dag(schedule="every tuesday")),
    dag_file("dag-impossible-cron", 422, "no fire time", dag(schedule="0 0 30 2 *")),
    dag_file("dag-not-yaml-data", 422, "invalid_dag", "[1, 2"),
    row("dag-yaml-not-a-string", "POST", "/v1/dags", 422, "yaml", json={"yaml": {"name": "x"}}),
    # -- names in paths ----------------------------------------------------------------------
    row("path-dag-name-with-quote", "GET", "/v1/dags/a'b", 422, "DAG name"),
    row("path-dag-name-traversal", "GET", "/v1/dags/..%2F..%2Fetc%2Fpasswd", 404, "no endpoint"),
    row("path-dataset-name-with-nul", "GET", "/v1/datasets/a%00b", 422, "dataset name"),
    row(
        "path-trigger-name-with-semicolon",
        "POST",
        "/v1/hooks/mallory_dag/x;y",
        422,
        "trigger name",
        json={},
    ),
    row("query-string-with-nul", "GET", "/v1/runs?dag=%00", 422, "NUL"),
    # -- trigger configs, on the user's own DAG ------------------------------------------------
    trigger(
        "trigger-100k-deep-json",
        422,
        "deeper than the limit of 64 levels",
        content=('{"config": {"a": ' + deep_json(100_000) + "}}").encode(),
        headers=JSON,
    ),
    trigger(
        "trigger-65-deep-json",
        422,
        "deeper than the limit of 64 levels",
        content=('{"config": {"a": ' + deep_json(63) + "}}").encode(),
        headers=JSON,
    ),
    trigger(
        "trigger-huge-config", 413, "limit", json={"config": {"blob": "x" * (MAX_BODY_BYTES + 1)}}
    ),
    trigger(
        "trigger-config-over-its-own-cap",
        422,
        "trigger config is",
        json={"config": {"blob": "x" * 1_500_000}},
    ),
    trigger("trigger-config-not-an-object", 422, "config", json={"config": [1, 2, 3]}),
    trigger("trigger-body-not-an-object", 422, "body", json=["config"]),
    trigger("trigger-config-with-nul", 422, "NUL", json={"config": {"k": "a\x00b"}}),
    row(
        "webhook-body-not-an-object",
        "POST",
        "/v1/hooks/mallory_dag/poke",
        422,
        "dictionary",
        json="poke",
    ),
    trigger(
        "trigger-idempotency-key-too-long",
        422,
        "idempotency-key",
        json={},
        headers={"Idempotency-Key": "k" * 201},
    ),
    # -- secrets -------------------------------------------------------------------------------
    row(
        "secret-name-with-space",
        "PUT",
        "/v1/secrets/my%20token",
        422,
        "secret name",
        json={"value": "v"},
    ),
    row(
        "secret-name-with-newline",
        "PUT",
        "/v1/secrets/token%0A",
        422,
        "secret name",
        json={"value": "v"},
    ),
    row(
        "secret-name-too-long",
        "PUT",
        "/v1/secrets/" + "t" * 200,
        422,
        "secret name",
        json={"value": "v"},
    ),
    row(
        "secret-empty-value", "PUT", "/v1/secrets/token", 422, "cannot be empty", json={"value": ""}
    ),
    row(
        "secret-huge-value",
        "PUT",
        "/v1/secrets/token",
        413,
        "limit",
        json={"value": "v" * (MAX_BODY_BYTES + 1)},
    ),
    row(
        "secret-value-over-its-cap",
        "PUT",
        "/v1/secrets/token",
        422,
        "at most",
        json={"value": "v" * 1_900_000},
    ),
    row("secret-value-not-a-string", "PUT", "/v1/secrets/token", 422, "value", json={"value": 42}),
    row(
        "secret-bad-use-role",
        "PUT",
        "/v1/secrets/token",
        422,
        "role",
        json={"value": "v", "use_roles": ["Admin; DROP ROLE"]},
    ),
    # -- internal bodies -----------------------------------------------------------------------
    row(
        "internal-missing-token",
        "POST",
        "/internal/claim",
        401,
        "internal token",
        json={"task_id": LEASE["task_id"], "worker_id": "w"},
        who="none",
    ),
    row(
        "internal-wrong-token",
        "POST",
        "/internal/claim",
        401,
        "internal token",
        json={"task_id": LEASE["task_id"], "worker_id": "w"},
        who="internal-wrong",
    ),
    row(
        "internal-api-key-is-not-the-token",
        "GET",
        f"/internal/task-secrets?task_id={LEASE['task_id']}&attempt=1",
        401,
        "internal token",
    ),
    row(
        "internal-chunked-40mb-without-token",
        "POST",
        "/internal/task-complete",
        401,
        "internal token",
        content=chunked(40 * 1024 * 1024),
        headers=JSON,
        who="none",
    ),
    row(
        "internal-chunked-40mb",
        "POST",
        f"/internal/task-complete?{FENCED}",
        413,
        f"over the limit of {MAX_BODY_BYTES} bytes",
        content=chunked(40 * 1024 * 1024),
        headers={**JSON, **TOKEN},
        who="internal",
    ),
    row(
        "internal-malformed-json",
        "POST",
        f"/internal/heartbeat?{FENCED}",
        422,
        "invalid JSON",
        content=b'{"progress": ',
        headers={**JSON, **TOKEN},
        who="internal",
    ),
    row(
        "internal-not-utf8",
        "POST",
        f"/internal/events?{FENCED}",
        422,
        "invalid JSON",
        content=b'{"events": "\xff\xfe"}',
        headers={**JSON, **TOKEN},
        who="internal",
    ),
    row(
        "internal-wrong-types",
        "POST",
        "/internal/claim",
        422,
        "task_id",
        json={"task_id": 7, "worker_id": ["w"]},
        who="internal",
    ),
    row(
        "internal-attempt-not-a-number",
        "POST",
        f"/internal/heartbeat?task_id={LEASE['task_id']}&attempt=one",
        422,
        "attempt",
        json={},
        headers=TOKEN,
        who="internal",
    ),
    row(
        "internal-deep-progress",
        "POST",
        f"/internal/heartbeat?{FENCED}",
        422,
        "64 levels",
        content=json.dumps({"progress": {}})
        .replace("{}", '{"p": ' + deep_json(5000) + "}")
        .encode(),
        headers={**JSON, **TOKEN},
        who="internal",
    ),
    row(
        "internal-lease-token-not-a-uuid",
        "GET",
        f"/internal/task-fetch?task_id={LEASE['task_id']}&attempt=1",
        422,
        "x-lease-token",
        headers={"X-Lease-Token": "' OR 1=1 --"},
        who="internal",
    ),
    row(
        "internal-too-many-events",
        "POST",
        f"/internal/events?{FENCED}",
        422,
        "1000",
        json={
            "events": [{"dataset_uuid": LEASE["task_id"], "cursor": str(i)} for i in range(1001)],
        },
        headers=TOKEN,
        who="internal",
    ),
    # -- the gateway itself --------------------------------------------------------------------
    row("no-api-key", "GET", "/v1/dags", 401, "API key is required", who="anon"),
    row(
        "gateway-50k-validation-problems",
        "POST",
        "/v1/datasets/mallory_blocks/read-roles",
        422,
        "more problems",
        json={"add": list(range(50_000))},
    ),
    row("unknown-route", "GET", "/v1/../../etc/passwd", 404, "no endpoint"),
    row("wrong-method", "DELETE", "/v1/secrets", 405, "not allowed"),
    row(
        "body-not-json-content-type",
        "POST",
        "/v1/query",
        422,
        "body",
        content=b"sql=SELECT 1",
        headers={"Content-Type": "text/plain"},
    ),
]


# -- the stack -----------------------------------------------------------------------------------
@dataclass
class Stack:
    services: Services
    url: str
    headers: dict[str, dict[str, str]]
    before: dict[str, Any]
    usual_seconds: float


# Files rows of the table try to write (COPY ... TO, ATTACH), outside the object store.
WRITE_TARGETS = (Path("/tmp/trace-hostile.csv"), Path("/tmp/x.db"))


def state(services: Services) -> dict[str, Any]:
    """Every table of the state database, as a digest of its rows; every object of the object
    store, with its size; whether (and when) the files in WRITE_TARGETS were written."""
    root = services.settings.object_store_root
    assert root is not None and root.is_dir()
    out: dict[str, Any] = {
        "objects": sorted(
            (str(f.relative_to(root)), f.stat().st_size) for f in root.rglob("*") if f.is_file()
        ),
        "files": [f.stat().st_mtime_ns if f.exists() else None for f in WRITE_TARGETS],
    }
    with services.pool.connection() as conn:
        tables = [
            r["table_name"]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1"
            ).fetchall()
        ]
        for t in tables:
            q = sql.SQL(
                "SELECT count(*) AS n, md5(string_agg(x::text, '|' ORDER BY x::text)) AS h FROM {} x"
            )
            out[t] = tuple(conn.execute(q.format(sql.Identifier(t))).fetchone().values())
    return out


def normal_query(stack_url: str, headers: dict[str, str]) -> float:
    t = time.monotonic()
    r = httpx.post(f"{stack_url}/v1/query", json={"sql": NORMAL_QUERY}, headers=headers, timeout=60)
    elapsed = time.monotonic() - t
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == NORMAL_ROWS
    return elapsed


def usual_time(stack_url: str, headers: dict[str, str]) -> float:
    return statistics.median(normal_query(stack_url, headers) for _ in range(5))


@pytest.fixture(scope="module")
def stack(
    pg_server: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_db)
            )
        )
    dsn = psycopg.conninfo.make_conninfo(pg_server, dbname=name)
    home: Path = tmp_path_factory.mktemp("hostile") / "home"
    svc = Services.build(Settings(state_dsn=dsn, auth="required", home=home), dsn)
    server = ApiServer(svc, "127.0.0.1", free_port(), background=False)
    server.start()
    try:
        svc.control.deploy(admin(svc), three_jobs("hello"))  # the org's: invisible to her
        mallory, key = user(svc, "mallory")
        svc.control.deploy(mallory, OWN_DAG)
        n = list(range(10))
        commit_parquet(
            svc, "mallory_blocks", pa.table({"block_number": pa.array(n, pa.int64())}), 0, 10
        )
        headers = {
            "user": {"Authorization": f"Bearer {key}"},
            "anon": {},
            "none": {},
            "internal": {"X-Internal-Token": svc.internal_token or ""},
            "internal-wrong": {"X-Internal-Token": "guess"},
        }
        usual = usual_time(server.url, headers["user"])
        yield Stack(svc, server.url, headers, state(svc), usual)
    finally:
        server.stop()
        svc.close()
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def send(stack: Stack, r: Row) -> httpx.Response:
    headers = {**stack.headers[r.who], **r.headers}
    content = r.content() if callable(r.content) else r.content
    with httpx.Client(base_url=stack.url, timeout=120) as client:
        if content is not None:
            return client.request(r.method, r.path, content=content, headers=headers)
        if r.json is not None:
            return client.request(r.method, r.path, json=r.json, headers=headers)
        return client.request(r.method, r.path, headers=headers)


@pytest.mark.parametrize("r", TABLE)
def test_hostile_input_gets_its_status_and_message(stack: Stack, r: Row) -> None:
    res = send(stack, r)
    assert res.status_code == r.status, res.text[:2000]
    if res.status_code >= 400:
        body = res.json()
        assert set(body) == {"error", "message", "detail"}, body
        assert isinstance(body["detail"], dict)
        assert r.fragment in f"{body['error']}: {body['message']}", body["message"][:2000]
    else:
        assert r.fragment in res.text.replace(" ", "")


def test_the_table_has_at_least_40_rows_across_every_area() -> None:
    ids = [p.id for p in TABLE]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)
    for area in ("query-", "dag-", "trigger-", "secret-", "internal-"):
        assert sum(i.startswith(area) for i in ids) >= 5, area


def test_after_the_table_the_stack_answers_and_nothing_changed(stack: Stack) -> None:
    for p in TABLE:  # again, whatever ran before (this test alone must still mean something)
        send(stack, p.values[0])
    usual = stack.usual_seconds
    after = usual_time(stack.url, stack.headers["user"])
    assert after <= max(1.0, 5 * usual), f"a normal query took {after:.3f} s; usually {usual:.3f} s"
    assert httpx.get(f"{stack.url}/healthz", timeout=10).json()["ok"] is True
    assert state(stack.services) == stack.before
