"""The Query Service over real Postgres, real Parquet files and real HTTP: names resolve through
the registry, versions are pinned at query start, read_roles hold, escapes are refused."""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from typing import Any

import duckdb
import httpx
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg import sql
from pydantic import SecretStr

from tests.support.dags import admin, user
from tests.support.datasets import commit_parquet, current, load_hot, version_location
from trace_platform.config import ObjectStoreBackend, Settings
from trace_platform.db import migrate as mig
from trace_platform.db.embedded import READER, SINK, EmbeddedPostgres, free_port
from trace_platform.db.pool import sink_dsn
from trace_platform.lite.stack import ApiServer
from trace_platform.objectstore import make_store
from trace_platform.operators.hot_window import load_range
from trace_platform.query.engine import Engine
from trace_platform.services import Services

CHAIN = """
name: chain
jobs:
  ingest:
    operator: noop
    outputs: [{backend: parquet}, {backend: parquet}]
  hot:
    operator: hot_window
    config: {window_blocks: 40}
    inputs: [{job: ingest, output: 0}]
    outputs: [{backend: postgres}]
publish:
  - {job: ingest, output_index: 0, dataset: blocks}
  - {job: ingest, output_index: 1, dataset: transactions}
  - {job: hot, output_index: 0, dataset: blocks_hot, hot_window: {of: blocks}}
"""


def blocks(start: int, end: int, tag: str = "cold") -> pa.Table:
    n = range(start, end + 1)
    return pa.table(
        {
            "block_number": pa.array(list(n), pa.int64()),
            "block_hash": pa.array([b"\x01" * 32 for _ in n], pa.binary()),
            "gas_used": pa.array([b * 10 for b in n], pa.uint64()),
            "source": pa.array([tag for _ in n]),
        }
    )


def txs(start: int, end: int) -> pa.Table:
    n = [b for b in range(start, end + 1) for _ in range(2)]
    return pa.table(
        {
            "block_number": pa.array(n, pa.int64()),
            "value": pa.array([10**30 + b for b in n], pa.decimal128(38, 0)),
        }
    )


@pytest.fixture
def chain(services: Services) -> Services:
    services.control.deploy(admin(services), CHAIN)
    for a in (0, 50):
        commit_parquet(services, "blocks", blocks(a, a + 49), a, a + 50)
        commit_parquet(services, "transactions", txs(a, a + 49), a, a + 50)
    return services


def q(services: Services, sql: str, **kw: object) -> list[list[object]]:
    return services.query.query(admin(services), sql, **kw).as_json()["rows"]  # type: ignore[no-any-return]


# On the harness's embedded cluster the Query Service reads Postgres as its own login.
embedded_only = pytest.mark.skipif(
    bool(os.environ.get("TRACE_TEST_DSN")), reason="the reader login is the embedded cluster's"
)


def query_login(services: Services) -> dict[str, str]:
    return psycopg.conninfo.conninfo_to_dict(services.query.pg_dsn)  # type: ignore[return-value]


def task_partition(services: Services) -> str:
    """One partition of task_registry (made at run time, not only at migration), qualified."""
    with services.pool.connection() as conn:
        return conn.execute(  # type: ignore[no-any-return]
            "SELECT format('%I.%I', n.nspname, c.relname) AS p FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE i.inhparent = 'task_registry'::regclass LIMIT 1"
        ).fetchone()["p"]


def assert_refused(conn: psycopg.Connection[Any], statements: list[str]) -> None:
    """Each statement is refused for lack of privilege, and, unqualified, a state table is not
    even visible."""
    for stmt in statements:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(stmt)
    for t in ("secrets", "api_keys", "task_registry"):
        with pytest.raises((psycopg.errors.UndefinedTable, psycopg.errors.InsufficientPrivilege)):
            conn.execute(f"SELECT * FROM {t}")


@pytest.fixture
def scratch_db(pg_server: str) -> Iterator[tuple[EmbeddedPostgres, str, str]]:
    """An empty database on the embedded cluster (the cluster, its name, its DSN), dropped
    afterwards, for tests of an upgrade."""
    cluster = EmbeddedPostgres.serving(pg_server)
    assert cluster is not None
    name = f"u_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield cluster, name, psycopg.conninfo.make_conninfo(pg_server, dbname=name)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def migrate_before(dsn: str, version: str) -> None:
    """Applies only the migrations before `version`: the database an older release left."""
    every = mig.available()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(mig, "available", lambda: [x for x in every if x.version < version])
        mig.migrate(dsn)


def test_cold_queries_by_dataset_name_are_exact(chain: Services) -> None:
    assert q(chain, "SELECT count(*), min(block_number), max(block_number) FROM blocks") == [
        [100, 0, 99]
    ]
    # DECIMAL(38,0) stays exact in JSON (a string), never a rounded float.
    rows = q(chain, "SELECT sum(value) FROM transactions WHERE block_number = 7")
    assert rows == [[str(2 * (10**30 + 7))]]
    rows = q(
        chain,
        "WITH t AS (SELECT * FROM transactions) SELECT count(*) FROM t JOIN blocks USING (block_number)",
    )
    assert rows == [[200]]


def test_hot_window_unions_with_cold_history_without_double_counting(chain: Services) -> None:
    # The sink keeps the newest 40 blocks; it has also seen blocks 100-119 that are not cold yet.
    assert load_hot(chain, "blocks_hot", blocks(50, 99, "hot"), 50, 100, window=40) == 40
    assert load_hot(chain, "blocks_hot", blocks(100, 119, "hot"), 100, 120, window=40) == 20
    # Re-running a range replaces it (idempotent), and the window trims to 80..119.
    assert load_hot(chain, "blocks_hot", blocks(100, 119, "hot"), 100, 120, window=40) == 20
    assert q(chain, "SELECT count(*), min(block_number), max(block_number) FROM blocks_hot") == [
        [40, 80, 119]
    ]
    if not os.environ.get("TRACE_TEST_DSN"):  # read as the least-privilege login, same database
        login = query_login(chain)
        assert login["user"] == READER
        assert login["dbname"] == psycopg.conninfo.conninfo_to_dict(chain.dsn)["dbname"]
    rows = q(
        chain,
        "SELECT source, count(*), min(block_number), max(block_number) FROM blocks GROUP BY 1 ORDER BY 1",
    )
    assert rows == [["cold", 80, 0, 79], ["hot", 40, 80, 119]]
    assert q(chain, "SELECT count(DISTINCT block_number), count(*) FROM blocks") == [[120, 120]]
    # A join across hot Postgres and cold Parquet.
    rows = q(
        chain,
        "SELECT count(*), sum(h.gas_used) FROM blocks_hot h JOIN transactions t USING (block_number)",
    )
    assert rows == [[40, str(sum(b * 10 * 2 for b in range(80, 100)))]]
    with chain.pool.connection() as conn:  # the published Postgres view follows the table
        assert conn.execute("SELECT count(*) AS n FROM published.blocks_hot").fetchone()["n"] == 40


def test_a_lagging_hot_window_loses_no_cold_rows(chain: Services) -> None:
    # Cold has 0-99; the window only got 40-59 so far (later ranges late or failed).
    load_hot(chain, "blocks_hot", blocks(40, 59, "hot"), 40, 60, window=1000)
    rows = q(chain, "SELECT source, count(*) FROM blocks GROUP BY 1 ORDER BY 1")
    assert rows == [["cold", 80], ["hot", 20]]
    # The `range=…` folders are layout, not a column.
    assert "range" not in [
        c["name"]
        for c in chain.query.query(admin(chain), "SELECT * FROM blocks LIMIT 1").as_json()[
            "columns"
        ]
    ]


def test_no_password_in_what_a_query_can_see(chain: Services) -> None:
    load_hot(chain, "blocks_hot", blocks(90, 99, "hot"), 90, 100, window=1000)
    password = str(psycopg.conninfo.conninfo_to_dict(chain.dsn).get("password"))
    out = q(chain, "WITH x AS (SELECT 1) SELECT * FROM blocks_hot LIMIT 1")
    assert password not in str(out)
    # The worker's engine, built here to look inside it (queries cannot: table functions).
    engine = Engine(chain.query.pg_dsn)
    try:
        pins = chain.query.plan(admin(chain), "SELECT 1 FROM blocks").pins
        with engine.cursor(pins, chain.query.limits) as engine_con:
            shown = engine_con.execute("SELECT path FROM duckdb_databases()").fetchall()
        assert all(password not in str(p) for p in shown)
    finally:
        engine.close()


def test_evicted_duckdb_instances_are_closed(chain: Services) -> None:
    """The engine keeps a few instances (one per pin set); one pushed out of the cache is
    closed at once, or by the last query still running on it."""
    load_hot(chain, "blocks_hot", blocks(90, 99, "hot"), 90, 100, window=1000)
    engine = Engine(chain.query.pg_dsn, cache_size=1)
    limits = chain.query.limits
    first = chain.query.plan(admin(chain), "SELECT 1 FROM blocks").pins
    second = chain.query.plan(admin(chain), "SELECT 1 FROM blocks_hot").pins
    try:
        with engine.cursor(first, limits) as cur:
            old = next(iter(engine._cache.values()))
            with engine.cursor(second, limits) as other:  # evicts `first` while it runs
                assert other.execute("SELECT 1").fetchone() == (1,)
            assert cur.execute("SELECT 1").fetchone() == (1,)  # still usable: its query runs
        with pytest.raises(duckdb.ConnectionException):
            old.execute("SELECT 1")  # closed by its last cursor
        with engine.cursor(first, limits):  # evicts `second`, nobody on it: closed at once
            pass
        assert len(engine._cache) == 1 and not engine._busy and not engine._evicted
    finally:
        engine.close()


@embedded_only
def test_the_query_login_reads_published_data_and_nothing_else(chain: Services) -> None:
    load_hot(chain, "blocks_hot", blocks(90, 99, "hot"), 90, 100, window=1000)
    location = version_location(chain, current(chain, "blocks_hot")["current_version"])
    schema, _, table = location.partition(".")
    partition = task_partition(chain)
    with psycopg.connect(chain.query.pg_dsn, autocommit=True) as conn:
        # Read-only by default (and the ATTACH asks for it too).
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, table)))
        conn.execute("SET default_transaction_read_only = off")  # now only privileges stop it
        role = conn.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles"
            " WHERE rolname = current_user"
        ).fetchone()
        assert role == (False, False, False, False)
        hot = sql.Identifier(schema, table)
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(hot)).fetchone() == (10,)
        assert conn.execute("SELECT count(*) FROM published.blocks_hot").fetchone() == (10,)
        refused = [
            *(
                f"SELECT * FROM public.{t}"
                for t in ("secrets", "api_keys", "users", "task_registry", "outbox", "datasets")
            ),
            f"SELECT * FROM {partition}",  # a partition made at run time, not only at migration
            "SELECT pg_read_file('/etc/passwd')",
            "SELECT pg_ls_dir('.')",
            "COPY (SELECT 1) TO PROGRAM 'id'",
            "COPY (SELECT 1) TO '/tmp/trace-reader-copy'",
            "CREATE SCHEMA evil",
            "CREATE TABLE public.evil (x int)",
            "CREATE TABLE published.evil (x int)",
            f'CREATE TABLE "{schema}".evil (x int)',
            f'DELETE FROM "{schema}"."{table}"',
            "SET ROLE trace",
        ]
        assert_refused(conn, refused)


@embedded_only
def test_published_tables_of_an_upgraded_database_become_readable(
    scratch_db: tuple[EmbeddedPostgres, str, str],
) -> None:
    cluster, name, dsn = scratch_db
    old, new, other = (f"dataset_{uuid.uuid4().hex}" for _ in range(3))
    migrate_before(dsn, "0009")
    with psycopg.connect(dsn, autocommit=True) as conn:  # published before the upgrade
        conn.execute(f"CREATE SCHEMA {old}; CREATE TABLE {old}.v_1 AS SELECT 1 AS x")
        conn.execute(f"CREATE VIEW published.before AS SELECT * FROM {old}.v_1")
    mig.migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:  # after it, as the sink would
        conn.execute(f"CREATE SCHEMA {new}; CREATE TABLE {new}.v_1 (x int)")
        conn.execute(f"CREATE SCHEMA {other}x; CREATE TABLE {other}x.t (x int)")
        conn.execute("CREATE TABLE public.later_state (x int)")
    with psycopg.connect(cluster.reader_dsn(name), autocommit=True) as conn:
        assert conn.execute(f"SELECT x FROM {old}.v_1").fetchone() == (1,)
        assert conn.execute("SELECT x FROM published.before").fetchone() == (1,)
        assert conn.execute(f"SELECT count(*) FROM {new}.v_1").fetchone() == (0,)
        for t in (f"{other}x.t", "public.later_state"):  # not a dataset schema: not granted
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM {t}")


def sink_login(services: Services) -> str:
    """The worker's resolution, here: the harness's cluster runs in this process."""
    dsn = sink_dsn(services.settings, services.dsn)
    assert psycopg.conninfo.conninfo_to_dict(dsn)["user"] == SINK
    return dsn


def load_as_sink(services: Services, name: str, table: pa.Table, start: int, end: int) -> int:
    location = version_location(services, current(services, name)["current_version"])
    return load_range(sink_login(services), location, name, table, start, end, 1000)


@embedded_only
def test_the_sink_login_loads_the_window_and_the_reader_reads_it(chain: Services) -> None:
    assert load_as_sink(chain, "blocks_hot", blocks(90, 99, "hot"), 90, 100) == 10
    assert load_as_sink(chain, "blocks_hot", blocks(90, 109, "hot"), 90, 110) == 20  # replaces
    location = version_location(chain, current(chain, "blocks_hot")["current_version"])
    schema, _, table = location.partition(".")
    # Made by the sink's login (its own), read by the Query Service's, through 0009's grants.
    assert query_login(chain)["user"] == READER
    assert q(chain, "SELECT count(*), max(block_number) FROM blocks_hot") == [[20, 109]]
    with psycopg.connect(chain.query.pg_dsn, autocommit=True) as conn:
        hot = sql.Identifier(schema, table)
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(hot)).fetchone() == (20,)
        assert conn.execute("SELECT count(*) FROM published.blocks_hot").fetchone() == (20,)
    with chain.pool.connection() as conn:
        owners = conn.execute(
            "SELECT c.relname, pg_get_userbyid(c.relowner) AS owner FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE (n.nspname = %s AND c.relname = %s)"
            " OR (n.nspname = 'published' AND c.relname = 'blocks_hot')",
            [schema, table],
        ).fetchall()
        schema_owner = conn.execute(
            "SELECT pg_get_userbyid(nspowner) AS o FROM pg_namespace WHERE nspname = %s", [schema]
        ).fetchone()["o"]
    assert sorted(r["owner"] for r in owners) == [SINK, SINK]
    assert schema_owner == "trace"  # made for the sink by migration 0010's function


@embedded_only
def test_the_sink_login_reaches_no_state(chain: Services) -> None:
    load_as_sink(chain, "blocks_hot", blocks(90, 99, "hot"), 90, 100)
    partition = task_partition(chain)
    with psycopg.connect(sink_login(chain), autocommit=True) as conn:
        role = conn.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls,"
            " pg_has_role('trace_sink_write', 'USAGE'), pg_has_role('pg_read_all_data', 'USAGE'),"
            " pg_has_role('pg_write_all_data', 'USAGE'), pg_has_role('trace', 'USAGE'),"
            " has_database_privilege(current_database(), 'CREATE')"
            " FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert role == (False, False, False, False, False, True, False, False, False, False)
        refused = [
            *(
                f"SELECT * FROM public.{t}"
                for t in (
                    "secrets",
                    "api_keys",
                    "users",
                    "task_registry",
                    "outbox",
                    "datasets",
                    "dataset_versions",
                    "schema_migrations",
                )
            ),
            f"SELECT * FROM {partition}",
            "UPDATE public.datasets SET location = 'x'",
            "CREATE TABLE public.evil (x int)",
            "CREATE SCHEMA evil",
            "CREATE SCHEMA trace",  # the superuser's "$user": it would shadow public for it
            "SELECT trace_sink_ddl.ensure_schema('trace')",
            "SELECT trace_sink_ddl.ensure_schema('dataset_x')",
            "SELECT trace_sink_ddl.ensure_schema('public')",
            "DROP SCHEMA published CASCADE",
            "CREATE FUNCTION trace_sink_ddl.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "SELECT pg_read_file('/etc/passwd')",
            "COPY (SELECT 1) TO PROGRAM 'id'",
            "COPY (SELECT 1) TO '/tmp/trace-sink-copy'",
            "SET ROLE trace",
            "ALTER ROLE trace_sink SUPERUSER",
            "CREATE ROLE evil",
        ]
        assert_refused(conn, refused)


@embedded_only
def test_an_upgraded_window_stays_loadable_by_the_sink_login(
    scratch_db: tuple[EmbeddedPostgres, str, str],
) -> None:
    """Tables and views a sink made with the state login before 0010 go to the sink's group."""
    cluster, name, dsn = scratch_db
    location = f"dataset_{uuid.uuid4().hex}.v_{uuid.uuid4().hex}"
    migrate_before(dsn, "0010")
    assert load_range(dsn, location, "old_hot", blocks(0, 9), 0, 10, 100) == 10
    mig.migrate(dsn)
    wider = blocks(0, 9).append_column("extra", pa.array(list(range(10)), pa.int32()))
    assert load_range(cluster.sink_dsn(name), location, "old_hot", wider, 0, 10, 100) == 10
    with psycopg.connect(cluster.reader_dsn(name), autocommit=True) as conn:
        assert conn.execute("SELECT sum(extra) FROM published.old_hot").fetchone() == (45,)


def test_a_query_keeps_the_version_it_pinned_across_a_cutover(chain: Services) -> None:
    me = admin(chain)
    before = chain.query.plan(me, "SELECT count(*) FROM blocks")
    # A materialization change to the producing job: deploy builds a new version beside the
    # live one; readers keep the live one until the cutover swaps it in.
    chain.control.deploy(
        me, CHAIN.replace("operator: noop\n", "operator: noop\n    config: {v: 2}\n")
    )
    with chain.pool.connection() as conn:
        ver = conn.execute(
            "SELECT o.dataset_version FROM dag_version_outputs o JOIN datasets d USING "
            "(dataset_uuid) WHERE d.dataset_name = 'blocks' AND o.dag_version = 2"
        ).fetchone()["dataset_version"]  # type: ignore[index]
    commit_parquet(chain, "blocks", blocks(0, 9, "v2"), 0, 10, version=ver)
    building = chain.query.query(me, "SELECT count(*), min(source) FROM blocks").as_json()
    assert building["rows"] == [[100, "cold"]]  # the rebuild is not served before its cutover
    chain.control.changes.cutover(me, "chain")
    # Started before the cutover: still the old version, whatever runs after.
    assert chain.query.execute(before).as_json()["rows"] == [[100]]
    after = chain.query.query(me, "SELECT count(*), min(source) FROM blocks").as_json()
    assert after["rows"] == [[10, "v2"]] and after["pinned"]["blocks"] == str(ver)
    assert before.versions["blocks"] != str(ver)


@pytest.mark.parametrize(
    ("sql", "status", "needle"),
    [
        ("SELECT * FROM read_parquet('/etc/passwd')", 422, "table functions are not allowed"),
        ("SELECT * FROM read_csv('/etc/passwd')", 422, "read_csv"),
        ("SELECT * FROM '/etc/passwd'", 404, "no dataset named '/etc/passwd' that you can read"),
        ("SELECT * FROM postgres_query('trace_pg', 'SELECT * FROM tasks')", 422, "postgres_query"),
        ("SELECT * FROM trace_pg.public.task_status", 422, "qualified names"),
        ("SELECT * FROM main.blocks", 422, "qualified names"),
        ("SELECT current_setting('allowed_paths')", 422, "not allowed"),
        ("DELETE FROM blocks", 422, "only SELECT"),
        ("ATTACH 'x.db' AS x", 422, "only SELECT"),
        ("COPY blocks TO '/tmp/x.csv'", 422, "only SELECT"),
        ("SELECT 1; SELECT 2", 422, "one statement"),
        ("SELEC 1", 422, "bad SQL"),
        ("SELECT * FROM no_such_dataset", 404, "published datasets you can read: blocks"),
        ("SELECT no_such_column FROM blocks", 400, "no_such_column"),
    ],
)
def test_escapes_and_bad_sql_get_clear_errors(
    http: tuple[Services, str, dict[str, str]], sql: str, status: int, needle: str
) -> None:
    _, url, auth = http
    r = httpx.post(f"{url}/v1/query", json={"sql": sql}, headers=auth)
    assert r.status_code == status, r.text
    assert needle in r.json()["message"]


@pytest.fixture
def http(
    chain: Services, settings: Settings, dsn: str
) -> Iterator[tuple[Services, str, dict[str, str]]]:
    svc = Services.build(settings.model_copy(update={"auth": "required"}), dsn)
    server = ApiServer(svc, "127.0.0.1", free_port(), background=False)
    server.start()
    key = svc.new_admin_key or (svc.settings.home / "admin.key").read_text().strip()
    yield svc, server.url, {"Authorization": f"Bearer {key}"}
    server.stop()
    svc.close()


def test_read_roles_gate_queries(http: tuple[Services, str, dict[str, str]]) -> None:
    svc, url, as_admin = http
    _, key = user(svc, "carol", roles=["analyst"])
    as_carol = {"Authorization": f"Bearer {key}"}
    r = httpx.post(f"{url}/v1/query", json={"sql": "SELECT count(*) FROM blocks"}, headers=as_carol)
    # Unreadable answers like unknown (no existence oracle).
    assert r.status_code == 404, r.text
    assert "no dataset named 'blocks' that you can read" in r.json()["message"]
    assert "rows" not in r.json()
    r = httpx.post(
        f"{url}/v1/datasets/blocks/read-roles", json={"add": ["analyst"]}, headers=as_admin
    )
    assert r.status_code == 200
    r = httpx.post(f"{url}/v1/query", json={"sql": "SELECT count(*) FROM blocks"}, headers=as_carol)
    assert r.status_code == 200 and r.json()["rows"] == [[100]]
    # One unreadable dataset in a join refuses the whole query.
    sql = "SELECT count(*) FROM blocks JOIN transactions USING (block_number)"
    r = httpx.post(f"{url}/v1/query", json={"sql": sql}, headers=as_carol)
    assert r.status_code == 404 and "'transactions'" in r.json()["message"]
    assert "'blocks'" not in r.json()["message"].split("(")[0]


def test_limits_formats_and_export(http: tuple[Services, str, dict[str, str]]) -> None:
    svc, url, auth = http
    r = httpx.post(
        f"{url}/v1/query", json={"sql": "SELECT * FROM transactions", "max_rows": 50}, headers=auth
    )
    assert r.status_code == 422 and r.json()["error"] == "limit_exceeded"
    assert "sql_transform" in r.json()["message"] and "--export" in r.json()["message"]
    slow = "SELECT count(*) FROM blocks a, blocks b, blocks c, blocks d, blocks e, blocks f"
    r = httpx.post(
        f"{url}/v1/query", json={"sql": slow, "timeout_seconds": 0.5}, headers=auth, timeout=30
    )
    assert r.status_code == 422 and "time limit of 0.5 s" in r.json()["message"]

    sql = "SELECT block_number, block_hash, gas_used FROM blocks ORDER BY 1 LIMIT 3"
    r = httpx.post(f"{url}/v1/query", json={"sql": sql, "format": "csv"}, headers=auth)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    lines = r.text.strip().splitlines()
    assert lines[0] == '"block_number","block_hash","gas_used"' and lines[1].startswith('0,"0x0101')
    r = httpx.post(f"{url}/v1/query", json={"sql": sql, "format": "parquet"}, headers=auth)
    assert pq.read_table(io.BytesIO(r.content)).num_rows == 3

    r = httpx.post(
        f"{url}/v1/query", json={"sql": "SELECT * FROM transactions", "export": True}, headers=auth
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["row_count"] == 200 and out["location"].endswith(".parquet")
    data = make_store(svc.settings).get(out["key"])
    assert pq.read_table(io.BytesIO(data)).num_rows == 200


def test_parquet_in_s3_reads_through_httpfs_and_stays_sandboxed(
    settings: Settings, dsn: str, s3_endpoint: str
) -> None:
    s3 = settings.model_copy(
        update={
            "object_store": ObjectStoreBackend.s3,
            "s3_endpoint_url": s3_endpoint,
            "s3_bucket": "query-test",
            "s3_access_key_id": "test",
            "s3_secret_access_key": SecretStr("test"),
        }
    )
    svc = Services.build(s3, dsn)
    try:
        make_store(s3).ensure_bucket()
        svc.control.deploy(admin(svc), CHAIN)
        commit_parquet(svc, "blocks", blocks(0, 49), 0, 50)
        out = svc.query.query(admin(svc), "SELECT count(*), max(block_number) FROM blocks")
        assert out.as_json()["rows"] == [[50, 49]]
        assert all(f.startswith("s3://query-test/") for f in out.plan.pins["blocks"].files)
        with pytest.raises(Exception, match="table functions"):
            svc.query.query(admin(svc), "SELECT * FROM read_parquet('s3://query-test/**')")
    finally:
        svc.close()
