"""DuckDB instances that can read exactly a set of pinned datasets, and nothing else.

Each instance is built for one pin set: Parquet views over the pinned files, Postgres views over
the pinned tables through a read-only ATTACH (read-only transactions too), external access then
switched off with only the pinned files allowed, and the configuration locked. Building one costs
tens of milliseconds (extension load, connection), so instances are cached by pin set; a new
commit or a cutover makes a new pin set, and so a new instance.

The Query Service runs all of this in its worker processes (runner.py, under kernel limits), never
in the API process."""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import duckdb
import duckdb_extensions
import psycopg
import pyarrow as pa

from trace_platform.errors import Invalid
from trace_platform.query import bignum
from trace_platform.query.errors import LimitExceeded
from trace_platform.query.pins import Pin

PG_ALIAS = "trace_pg"


@dataclass(frozen=True)
class S3Access:
    endpoint: str | None  # host:port of an S3-compatible endpoint; None for AWS
    region: str
    key_id: str | None
    secret: str | None
    use_ssl: bool


@dataclass(frozen=True)
class Limits:
    """One query's limits, from the TRACE_QUERY_* settings as QueryService narrows them for the
    call (a caller's max_rows or timeout, an export's own caps)."""

    timeout_seconds: float
    max_rows: int
    memory_limit: str
    threads: int
    max_result_bytes: int


class NoData(Invalid):
    code = "no_data"


def _q(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def local_path(uri: str) -> str:
    """DuckDB reads local files by path; the store hands out file:// URIs."""
    return unquote(urlparse(uri).path) if uri.startswith("file://") else uri


def _pg_table(location: str) -> str:
    schema, _, table = location.partition(".")
    return f"{PG_ALIAS}.{_q(schema)}.{_q(table)}"


def _source(pin: Pin, amounts: tuple[str, ...] = ()) -> str:
    """A SELECT over one pinned dataset (without its hot window); `amounts` (limbs columns) read
    as BIGNUM."""
    if pin.backend == "postgres":
        assert pin.table is not None
        return f"SELECT * FROM {_pg_table(pin.table)}"
    files = ", ".join(_lit(local_path(f)) for f in pin.files)
    exact = ", ".join(f"{bignum.view_expression(c)} AS {_q(c)}" for c in amounts)
    columns = f"* REPLACE ({exact})" if exact else "*"
    # No hive partitioning: the `range=…` folders are layout, not a column.
    return (
        f"SELECT {columns} FROM read_parquet([{files}], union_by_name = true, "
        "hive_partitioning = false)"
    )


def view_sql(pin: Pin, amounts: tuple[str, ...] = ()) -> str:
    """The view named like the dataset, its amount columns (`amounts`, Parquet only) as BIGNUM.
    With a hot window: every hot row, plus the cold rows of every key the window does not hold
    (an anti join on the key), so a row present in both is counted once, and a window that lags
    or has a gap loses nothing."""
    hot = pin.hot
    if hot is None:
        if pin.empty:
            raise NoData(
                f"dataset '{pin.name}' has no data yet (version {pin.version} has no commits)"
            )
        return _source(pin, amounts)
    if not pin.files:
        return _source(hot)
    key = _q(pin.hot_key or "block_number")
    return (
        f"SELECT * FROM ({_source(hot)}) "
        f"UNION ALL BY NAME SELECT cold.* FROM ({_source(pin, amounts)}) cold "
        f"ANTI JOIN (SELECT DISTINCT {key} FROM {_pg_table(hot.table or '')}) held USING ({key})"
    )


def check_pins(pins: dict[str, Pin], s3: S3Access | None) -> None:
    """What would fail to build an instance (no data yet, s3:// without S3 settings), said in
    the API process before a worker is involved."""
    for pin in pins.values():
        view_sql(pin)
        every = [p for p in (pin, pin.hot) if p is not None]
        if s3 is None and any(f.startswith("s3://") for p in every for f in p.files):
            raise Invalid("a dataset lives in s3:// but the Query Service has no S3 settings")


class Engine:
    """Builds and caches sandboxed DuckDB instances, one per pin set (in a query worker
    process: see runner.py)."""

    def __init__(self, pg_dsn: str, s3: S3Access | None = None, cache_size: int = 16) -> None:
        self.pg_dsn = pg_dsn
        self.s3 = s3
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[Pin, ...], duckdb.DuckDBPyConnection] = OrderedDict()
        self._busy: dict[int, int] = {}  # id(instance) -> cursors running on it
        self._evicted: dict[int, duckdb.DuckDBPyConnection] = {}  # closed by its last cursor
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def cursor(self, pins: dict[str, Pin], limits: Limits) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor on the instance for this pin set (built on first use), closed after. An
        instance evicted from the cache is closed at once, or by its last running cursor."""
        key = (*sorted(pins.values(), key=lambda p: p.name), limits.memory_limit)
        con = self._checkout(key)  # type: ignore[arg-type]
        if con is None:
            built = self._build(pins, limits)
            con = self._checkout(key, built)  # type: ignore[arg-type]
            assert con is not None
        try:
            cur = con.cursor()
            try:
                yield cur
            finally:
                cur.close()
        finally:
            self._checkin(con)

    def _checkout(
        self, key: tuple[Pin, ...], built: duckdb.DuckDBPyConnection | None = None
    ) -> duckdb.DuckDBPyConnection | None:
        """The cached instance for `key` (or `built`, cached now), counted as busy."""
        with self._lock:
            con = self._cache.get(key)
            if con is None and built is not None:
                con = self._cache[key] = built
                while len(self._cache) > self.cache_size:
                    _, old = self._cache.popitem(last=False)
                    if self._busy.get(id(old)):
                        self._evicted[id(old)] = old  # cursors of other threads still run
                    else:
                        old.close()
            elif con is not None:
                self._cache.move_to_end(key)
                if built is not None:  # another thread built it meanwhile
                    built.close()
            if con is not None:
                self._busy[id(con)] = self._busy.get(id(con), 0) + 1
            return con

    def _checkin(self, con: duckdb.DuckDBPyConnection) -> None:
        with self._lock:
            left = self._busy[id(con)] - 1
            if left:
                self._busy[id(con)] = left
                return
            del self._busy[id(con)]
            if self._evicted.pop(id(con), None) is not None:
                con.close()

    def _build(self, pins: dict[str, Pin], limits: Limits) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False})
        try:
            con.execute(f"SET memory_limit = {_lit(limits.memory_limit)}")
            con.execute(f"SET threads = {int(limits.threads)}")
            every = [p for pin in pins.values() for p in (pin, pin.hot) if p is not None]
            if any(p.backend == "postgres" for p in every):
                duckdb_extensions.import_extension("postgres_scanner", con=con)
                con.execute("LOAD postgres_scanner")
                self._attach_postgres(con)
            files = [f for p in every for f in p.files]
            if any(f.startswith("s3://") for f in files):
                self._s3(con)
            for pin in pins.values():
                amounts = bignum.amount_columns(con, _source(pin)) if pin.files else ()
                con.execute(f"CREATE VIEW {_q(pin.name)} AS {view_sql(pin, amounts)}")
            if files:
                allowed = ", ".join(_lit(local_path(f)) for f in files)
                con.execute(f"SET allowed_paths = [{allowed}]")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
        except Exception:
            con.close()
            raise
        return con

    def _attach_postgres(self, con: duckdb.DuckDBPyConnection) -> None:
        """Credentials go in a DuckDB secret (shown redacted), never in the ATTACH string that
        duckdb_databases() would show; every transaction is read-only on the server too."""
        params = psycopg.conninfo.conninfo_to_dict(self.pg_dsn)
        fields = {
            "host": "HOST",
            "port": "PORT",
            "dbname": "DATABASE",
            "user": "USER",
            "password": "PASSWORD",
        }
        secret = [f"{fields[k]} {_lit(str(v))}" for k, v in params.items() if k in fields]
        con.execute(f"CREATE SECRET trace_pg_login (TYPE postgres, {', '.join(secret)})")
        rest = {k: v for k, v in params.items() if k not in fields}
        rest["options"] = "-c default_transaction_read_only=on"
        conninfo = psycopg.conninfo.make_conninfo("", **rest)
        con.execute(
            f"ATTACH {_lit(conninfo)} AS {PG_ALIAS} "
            "(TYPE postgres, SECRET trace_pg_login, READ_ONLY)"
        )

    def _s3(self, con: duckdb.DuckDBPyConnection) -> None:
        duckdb_extensions.import_extension("httpfs", con=con)
        con.execute("LOAD httpfs")
        s3 = self.s3
        if s3 is None:
            raise Invalid("a dataset lives in s3:// but the Query Service has no S3 settings")
        parts = ["TYPE s3", f"REGION {_lit(s3.region)}"]
        if s3.key_id and s3.secret:
            parts += [f"KEY_ID {_lit(s3.key_id)}", f"SECRET {_lit(s3.secret)}"]
        if s3.endpoint:
            parts += [f"ENDPOINT {_lit(s3.endpoint)}", "URL_STYLE 'path'"]
        parts.append(f"USE_SSL {'true' if s3.use_ssl else 'false'}")
        con.execute(f"CREATE SECRET trace_s3 ({', '.join(parts)})")

    def close(self) -> None:
        with self._lock:
            for con in self._cache.values():
                con.close()
            self._cache.clear()


def run(
    cur: duckdb.DuckDBPyConnection,
    sql: str,
    params: dict[str, Any] | None,
    limits: Limits,
    *,
    export: bool = False,
) -> pa.Table:
    """Runs the statement under the time limit; returns a pyarrow Table of at most
    limits.max_rows rows and limits.max_result_bytes bytes (Arrow buffers, counted batch by
    batch as DuckDB streams them, so an oversized result stops early), or raises LimitExceeded."""
    max_rows = limits.max_rows
    timer = threading.Timer(limits.timeout_seconds, cur.interrupt)
    timer.start()
    try:
        cur.execute(sql, params or None)
        reader = cur.to_arrow_reader(min(max_rows + 1, 100_000))
        batches, rows, size = [], 0, 0
        for batch in reader:
            batches.append(batch)
            rows += batch.num_rows
            size += batch.nbytes
            if rows > max_rows:
                raise LimitExceeded.hit("max_rows", max_rows, export=export)
            if size > limits.max_result_bytes:
                raise LimitExceeded.hit("max_result_bytes", limits.max_result_bytes, export=export)
        # BIGNUM (exact amounts) leaves as exact decimal text.
        return bignum.to_text(pa.Table.from_batches(batches, schema=reader.schema))
    except duckdb.InterruptException:
        raise LimitExceeded.hit("timeout_seconds", limits.timeout_seconds, export=export) from None
    except (duckdb.OutOfMemoryException, MemoryError):
        raise LimitExceeded.hit("memory_limit", limits.memory_limit, export=export) from None
    finally:
        timer.cancel()


def duck_message(e: Exception) -> str:
    """DuckDB's error, first line (plus its LINE pointer when there is one)."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    head = lines[0] if lines else type(e).__name__
    where = next((ln for ln in lines[1:] if ln.startswith("LINE")), None)
    return f"{head} ({where.strip()})" if where else head
