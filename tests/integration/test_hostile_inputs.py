"""Hostile input at the gateway (issue 10): a table of requests a client with a no-role API key
(or none, or the internal endpoints' caller) can send, across the Query Service, DAG files,
trigger configs, secrets and internal bodies. Each answers its expected status, in Trace's error
shape, with a message that says what was wrong. After the whole table the stack still answers a
normal query within its usual time, and nothing stored changed.

One stack (database, Services, API on a real socket) serves the whole module; the last test
sends every row again and then compares every state table with the snapshot taken before the
first row."""

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


def row(id_: str, r: Row, *marks: pytest.MarkDecorator) -> Any:
    return pytest.param(r, id=id_, marks=list(marks))


JSON = {"Content-Type": "application/json"}
LEASE = {"task_id": str(uuid.UUID(int=1)), "attempt": 1, "lease_token": str(uuid.UUID(int=2))}

TABLE = [
    # -- the Query Service, as the no-role user -------------------------------------------
    row("query-bad-sql", Row("POST", "/v1/query", 422, "bad SQL", json={"sql": "SELEC 1"})),
    row(
        "query-two-statements",
        Row("POST", "/v1/query", 422, "one statement", json={"sql": "SELECT 1; SELECT 2"}),
    ),
    row(
        "query-table-function-file",
        Row(
            "POST",
            "/v1/query",
            422,
            "read_csv",
            json={"sql": "SELECT * FROM read_csv('/etc/passwd')"},
        ),
    ),
    row(
        "query-file-path-as-table",
        Row("POST", "/v1/query", 404, "/etc/passwd", json={"sql": "SELECT * FROM '/etc/passwd'"}),
    ),
    row(
        "query-postgres-scan-to-any-host",
        Row(
            "POST",
            "/v1/query",
            422,
            "postgres_scan",
            json={"sql": "SELECT * FROM postgres_scan('host=10.9.9.9 port=5432', 'public', 't')"},
        ),
    ),
    row(
        "query-setting",
        Row(
            "POST",
            "/v1/query",
            422,
            "not allowed",
            json={"sql": "SELECT current_setting('allowed_paths')"},
        ),
    ),
    row(
        "query-setting-inside-a-lambda",
        Row(
            "POST",
            "/v1/query",
            422,
            "not allowed",
            json={"sql": "SELECT list_transform([1], x -> current_setting('memory_limit'))"},
        ),
    ),
    row(
        "query-table-function-by-name",
        Row(
            "POST",
            "/v1/query",
            422,
            "not allowed",
            json={"sql": "SELECT * FROM query_table('duckdb_settings')"},
        ),
    ),
    row(
        "query-secret-lookup",
        Row(
            "POST",
            "/v1/query",
            422,
            "not allowed",
            json={"sql": "SELECT which_secret('s3://bucket/x', 's3')"},
        ),
    ),
    row(
        "query-view-definition",
        Row("POST", "/v1/query", 422, "not allowed", json={"sql": "SELECT pg_get_viewdef('x')"}),
    ),
    row(
        "query-binds-sql-text",
        Row(
            "POST",
            "/v1/query",
            422,
            "not allowed",
            json={"sql": "SELECT json_serialize_sql('SELECT * FROM duckdb_settings()')"},
        ),
    ),
    row(
        "query-set",
        Row("POST", "/v1/query", 422, "only SELECT", json={"sql": "SET threads = 1"}),
    ),
    row(
        "query-copy-to-file",
        Row(
            "POST",
            "/v1/query",
            422,
            "only SELECT",
            json={"sql": "COPY (SELECT 1) TO '/tmp/trace-hostile.csv'"},
        ),
    ),
    row(
        "query-attach",
        Row("POST", "/v1/query", 422, "only SELECT", json={"sql": "ATTACH '/tmp/x.db' AS x"}),
    ),
    row(
        "query-qualified-name",
        Row(
            "POST",
            "/v1/query",
            422,
            "qualified names",
            json={"sql": "SELECT * FROM main.mallory_blocks"},
        ),
    ),
    row(
        "query-unreadable-dataset-answers-like-unknown",
        Row("POST", "/v1/query", 404, "that you can read", json={"sql": "SELECT * FROM hello_raw"}),
    ),
    row(
        "query-huge-string-result",
        Row(
            "POST",
            "/v1/query",
            422,
            "larger than",
            json={"sql": "SELECT repeat('x', 30000000) AS s", "max_rows": 1},
        ),
    ),
    row(
        "query-sql-over-its-length-limit",
        Row("POST", "/v1/query", 422, "100000", json={"sql": "SELECT 1 " + " " * 100_000}),
    ),
    row(
        "query-huge-param-value",
        Row(
            "POST",
            "/v1/query",
            200,
            "1500000",
            json={"sql": "SELECT length($s) AS n", "params": {"s": "x" * 1_500_000}},
        ),
    ),
    row(
        "query-param-of-wrong-type",
        Row("POST", "/v1/query", 422, "params", json={"sql": "SELECT 1", "params": {"a": [1]}}),
    ),
    row("query-sql-not-a-string", Row("POST", "/v1/query", 422, "sql", json={"sql": 123})),
    row(
        "query-max-rows-not-a-number",
        Row("POST", "/v1/query", 422, "max_rows", json={"sql": "SELECT 1", "max_rows": "ten"}),
    ),
    row(
        "query-negative-timeout",
        Row(
            "POST",
            "/v1/query",
            422,
            "timeout_seconds",
            json={"sql": "SELECT 1", "timeout_seconds": -1},
        ),
    ),
    row(
        "query-nan-timeout",
        Row(
            "POST",
            "/v1/query",
            422,
            "invalid JSON",
            content=b'{"sql": "SELECT 1", "timeout_seconds": NaN}',
            headers=JSON,
        ),
    ),
    row(
        "query-absurd-timeout-is-capped",
        Row(
            "POST",
            "/v1/query",
            200,
            '"rows":[[1]]',
            json={"sql": "SELECT 1", "timeout_seconds": 1e308, "max_rows": 10**30},
        ),
    ),
    row(
        "query-neither-sql-nor-saved",
        Row("POST", "/v1/query", 422, "exactly one of sql or saved", json={"params": {}}),
    ),
    row(
        "query-saved-path-traversal",
        Row("POST", "/v1/query", 404, "no saved query", json={"saved": "../../../etc/passwd"}),
    ),
    row(
        "query-unknown-format",
        Row("POST", "/v1/query", 422, "format", json={"sql": "SELECT 1", "format": "xlsx"}),
    ),
    # -- DAG files (POST /v1/dags), as the no-role user --------------------------------------
    row(
        "dag-alias-bomb",
        Row("POST", "/v1/dags", 422, "aliases are expanded", json={"yaml": alias_bomb()}),
    ),
    row(
        "dag-100k-deep-yaml",
        Row("POST", "/v1/dags", 422, "deeper than 64 levels", json={"yaml": "[" * 100_000}),
    ),
    row(
        "dag-document-over-the-loader-limit",
        Row("POST", "/v1/dags", 422, "262,144", json={"yaml": "# " + "x" * 300_000 + "\n"}),
    ),
    row(
        "dag-2mb-document",
        Row("POST", "/v1/dags", 422, "1048576", json={"yaml": "#" * 2_000_000}),
    ),
    row(
        "dag-name-with-quote-and-semicolon",
        Row("POST", "/v1/dags", 422, "name", json={"yaml": dag("x'; DROP TABLE dags; --")}),
    ),
    row(
        "dag-name-path-traversal",
        Row("POST", "/v1/dags", 422, "name", json={"yaml": dag("../../etc")}),
    ),
    row(
        "dag-unknown-operator",
        Row(
            "POST",
            "/v1/dags",
            422,
            "unknown operator 'rm_rf'",
            json={"yaml": dag(operator="rm_rf")},
        ),
    ),
    row(
        "dag-bad-cron",
        Row(
            "POST",
            "/v1/dags",
            422,
            "not a valid cron expression",
            json={"yaml": dag(schedule="every tuesday")},
        ),
    ),
    row(
        "dag-impossible-cron",
        Row("POST", "/v1/dags", 422, "no fire time", json={"yaml": dag(schedule="0 0 30 2 *")}),
    ),
    row("dag-not-yaml-data", Row("POST", "/v1/dags", 422, "invalid_dag", json={"yaml": "[1, 2"})),
    row(
        "dag-yaml-not-a-string", Row("POST", "/v1/dags", 422, "yaml", json={"yaml": {"name": "x"}})
    ),
    # -- names in paths ----------------------------------------------------------------------
    row("path-dag-name-with-quote", Row("GET", "/v1/dags/a'b", 422, "DAG name")),
    row(
        "path-dag-name-traversal", Row("GET", "/v1/dags/..%2F..%2Fetc%2Fpasswd", 404, "no endpoint")
    ),
    row("path-dataset-name-with-nul", Row("GET", "/v1/datasets/a%00b", 422, "dataset name")),
    row(
        "path-trigger-name-with-semicolon",
        Row("POST", "/v1/hooks/mallory_dag/x;y", 422, "trigger name", json={}),
    ),
    row("query-string-with-nul", Row("GET", "/v1/runs?dag=%00", 422, "NUL")),
    # -- trigger configs, on the user's own DAG ------------------------------------------------
    row(
        "trigger-100k-deep-json",
        Row(
            "POST",
            "/v1/dags/mallory_dag/trigger",
            422,
            "deeper than the limit of 64 levels",
            content=('{"config": {"a": ' + deep_json(100_000) + "}}").encode(),
            headers=JSON,
        ),
    ),
    row(
        "trigger-65-deep-json",
        Row(
            "POST",
            "/v1/dags/mallory_dag/trigger",
            422,
            "deeper than the limit of 64 levels",
            content=('{"config": {"a": ' + deep_json(63) + "}}").encode(),
            headers=JSON,
        ),
    ),
    row(
        "trigger-huge-config",
        Row(
            "POST",
            "/v1/dags/mallory_dag/trigger",
            413,
            "limit",
            json={"config": {"blob": "x" * (MAX_BODY_BYTES + 1)}},
        ),
    ),
    row(
        "trigger-config-over-its-own-cap",
        Row(
            "POST",
            "/v1/dags/mallory_dag/trigger",
            422,
            "trigger config is",
            json={"config": {"blob": "x" * 1_500_000}},
        ),
    ),
    row(
        "trigger-config-not-an-object",
        Row("POST", "/v1/dags/mallory_dag/trigger", 422, "config", json={"config": [1, 2, 3]}),
    ),
    row(
        "trigger-body-not-an-object",
        Row("POST", "/v1/dags/mallory_dag/trigger", 422, "body", json=["config"]),
    ),
    row(
        "trigger-config-with-nul",
        Row("POST", "/v1/dags/mallory_dag/trigger", 422, "NUL", json={"config": {"k": "a\x00b"}}),
    ),
    row(
        "webhook-body-not-an-object",
        Row("POST", "/v1/hooks/mallory_dag/poke", 422, "dictionary", json="poke"),
    ),
    row(
        "trigger-idempotency-key-too-long",
        Row(
            "POST",
            "/v1/dags/mallory_dag/trigger",
            422,
            "idempotency-key",
            json={},
            headers={"Idempotency-Key": "k" * 201},
        ),
    ),
    # -- secrets -------------------------------------------------------------------------------
    row(
        "secret-name-with-space",
        Row("PUT", "/v1/secrets/my%20token", 422, "secret name", json={"value": "v"}),
    ),
    row(
        "secret-name-with-newline",
        Row("PUT", "/v1/secrets/token%0A", 422, "secret name", json={"value": "v"}),
    ),
    row(
        "secret-name-too-long",
        Row("PUT", "/v1/secrets/" + "t" * 200, 422, "secret name", json={"value": "v"}),
    ),
    row(
        "secret-empty-value",
        Row("PUT", "/v1/secrets/token", 422, "cannot be empty", json={"value": ""}),
    ),
    row(
        "secret-huge-value",
        Row("PUT", "/v1/secrets/token", 413, "limit", json={"value": "v" * (MAX_BODY_BYTES + 1)}),
    ),
    row(
        "secret-value-over-its-cap",
        Row("PUT", "/v1/secrets/token", 422, "at most", json={"value": "v" * 1_900_000}),
    ),
    row(
        "secret-value-not-a-string",
        Row("PUT", "/v1/secrets/token", 422, "value", json={"value": 42}),
    ),
    row(
        "secret-bad-use-role",
        Row(
            "PUT",
            "/v1/secrets/token",
            422,
            "role",
            json={"value": "v", "use_roles": ["Admin; DROP ROLE"]},
        ),
    ),
    # -- internal bodies -----------------------------------------------------------------------
    row(
        "internal-missing-token",
        Row(
            "POST",
            "/internal/claim",
            401,
            "internal token",
            json={"task_id": LEASE["task_id"], "worker_id": "w"},
            who="none",
        ),
    ),
    row(
        "internal-wrong-token",
        Row(
            "POST",
            "/internal/claim",
            401,
            "internal token",
            json={"task_id": LEASE["task_id"], "worker_id": "w"},
            who="internal-wrong",
        ),
    ),
    row(
        "internal-api-key-is-not-the-token",
        Row(
            "GET",
            f"/internal/task-secrets?task_id={LEASE['task_id']}&attempt=1",
            401,
            "internal token",
        ),
    ),
    row(
        "internal-chunked-40mb-without-token",
        Row(
            "POST",
            "/internal/task-complete",
            401,
            "internal token",
            content=chunked(40 * 1024 * 1024),
            headers=JSON,
            who="none",
        ),
    ),
    row(
        "internal-chunked-40mb",
        Row(
            "POST",
            "/internal/task-complete",
            413,
            f"over the limit of {MAX_BODY_BYTES} bytes",
            content=chunked(40 * 1024 * 1024),
            headers=JSON,
            who="internal",
        ),
    ),
    row(
        "internal-malformed-json",
        Row(
            "POST",
            "/internal/heartbeat",
            422,
            "invalid JSON",
            content=b'{"task_id": ',
            headers=JSON,
            who="internal",
        ),
    ),
    row(
        "internal-not-utf8",
        Row(
            "POST",
            "/internal/events",
            422,
            "invalid JSON",
            content=b'{"task_id": "\xff\xfe"}',
            headers=JSON,
            who="internal",
        ),
    ),
    row(
        "internal-wrong-types",
        Row(
            "POST",
            "/internal/claim",
            422,
            "task_id",
            json={"task_id": 7, "worker_id": ["w"]},
            who="internal",
        ),
    ),
    row(
        "internal-attempt-not-a-number",
        Row(
            "POST",
            "/internal/heartbeat",
            422,
            "attempt",
            json={**LEASE, "attempt": "one"},
            who="internal",
        ),
    ),
    row(
        "internal-deep-progress",
        Row(
            "POST",
            "/internal/heartbeat",
            422,
            "64 levels",
            content=json.dumps({**LEASE, "progress": {}})
            .replace("{}", '{"p": ' + deep_json(5000) + "}")
            .encode(),
            headers=JSON,
            who="internal",
        ),
    ),
    row(
        "internal-lease-token-not-a-uuid",
        Row(
            "GET",
            f"/internal/task-fetch?task_id={LEASE['task_id']}&attempt=1",
            422,
            "x-lease-token",
            headers={"X-Lease-Token": "' OR 1=1 --"},
            who="internal",
        ),
    ),
    row(
        "internal-too-many-events",
        Row(
            "POST",
            "/internal/events",
            422,
            "1000",
            json={
                **LEASE,
                "events": [
                    {"dataset_uuid": LEASE["task_id"], "cursor": str(i)} for i in range(1001)
                ],
            },
            who="internal",
        ),
    ),
    # -- the gateway itself --------------------------------------------------------------------
    row("no-api-key", Row("GET", "/v1/dags", 401, "API key is required", who="anon")),
    row(
        "gateway-50k-validation-problems",
        Row(
            "POST",
            "/v1/datasets/mallory_blocks/read-roles",
            422,
            "more problems",
            json={"add": list(range(50_000))},
        ),
    ),
    row("unknown-route", Row("GET", "/v1/../../etc/passwd", 404, "no endpoint")),
    row("wrong-method", Row("DELETE", "/v1/secrets", 405, "not allowed")),
    row(
        "body-not-json-content-type",
        Row(
            "POST",
            "/v1/query",
            422,
            "body",
            content=b"sql=SELECT 1",
            headers={"Content-Type": "text/plain"},
        ),
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


def state(services: Services) -> dict[str, Any]:
    """Every table of the state database, as a digest of its rows."""
    with services.pool.connection() as conn:
        tables = [
            r["table_name"]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1"
            ).fetchall()
        ]
        out = {}
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
