"""The Query Service: SQL over published datasets, each pinned at query start, in DuckDB.

`plan` screens the statement and pins every dataset it names (read_roles enforced); `execute`
runs it against exactly those pins, so a cutover during a query does not move it."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
from psycopg_pool import ConnectionPool

from trace_platform.config import ObjectStoreBackend, Settings
from trace_platform.identity import Actor
from trace_platform.objectstore import ObjectStore
from trace_platform.query import catalog, formats, guard
from trace_platform.query.engine import Engine, Limits, S3Access, run
from trace_platform.query.errors import LimitExceeded, QueryFailed


@dataclass
class Plan:
    actor: Actor
    sql: str
    params: dict[str, Any]
    pins: dict[str, catalog.Pin]
    pinned_at: float = field(default_factory=time.time)

    @property
    def versions(self) -> dict[str, str]:
        return {n: str(p.version) for n, p in sorted(self.pins.items())}


@dataclass
class Result:
    table: pa.Table
    plan: Plan
    elapsed_ms: float

    def as_json(self) -> dict[str, Any]:
        return {
            "columns": formats.columns(self.table),
            "rows": formats.rows(self.table),
            "row_count": self.table.num_rows,
            "pinned": self.plan.versions,
            "elapsed_ms": round(self.elapsed_ms, 2),
        }


def s3_access(settings: Settings) -> S3Access | None:
    if settings.object_store is not ObjectStoreBackend.s3:
        return None
    endpoint = settings.s3_endpoint_url
    host = endpoint.split("://", 1)[-1].rstrip("/") if endpoint else None
    secret = settings.s3_secret_access_key
    return S3Access(
        endpoint=host,
        region=settings.s3_region,
        key_id=settings.s3_access_key_id,
        secret=secret.get_secret_value() if secret else None,
        use_ssl=bool(endpoint and endpoint.startswith("https")),
    )


class QueryService:
    def __init__(
        self, pool: ConnectionPool, store: ObjectStore, pg_dsn: str, settings: Settings
    ) -> None:
        self.pool = pool
        self.store = store
        self.settings = settings
        self.engine = Engine(pg_dsn, s3_access(settings))
        self.limits = Limits(
            timeout_seconds=settings.query_timeout_seconds,
            max_rows=settings.query_max_rows,
            memory_limit=settings.query_memory_limit,
        )

    def plan(self, actor: Actor, sql: str, params: dict[str, Any] | None = None) -> Plan:
        names = guard.dataset_names(sql)
        pins = catalog.pin(self.pool, self.store, actor, names)
        return Plan(actor, sql, params or {}, pins)

    def execute(
        self,
        plan: Plan,
        *,
        max_rows: int | None = None,
        timeout_seconds: float | None = None,
        for_export: bool = False,
    ) -> Result:
        """Caller limits may only lower the service's; an export has its own, larger row cap."""
        limits = self.limits
        if timeout_seconds is not None:
            limits = Limits(
                min(timeout_seconds, limits.timeout_seconds),
                limits.max_rows,
                limits.memory_limit,
                limits.threads,
            )
        t0 = time.perf_counter()
        cur = self.engine.connection(plan.pins, limits)
        try:
            ceiling = self.settings.query_export_max_rows if for_export else limits.max_rows
            cap = min(max_rows or ceiling, ceiling)
            table = run(cur, plan.sql, plan.params, limits, cap)
        except LimitExceeded:
            raise
        except duckdb.Error as e:
            raise QueryFailed(_duck_message(e)) from None
        finally:
            cur.close()
        return Result(table, plan, (time.perf_counter() - t0) * 1000)

    def query(
        self, actor: Actor, sql: str, params: dict[str, Any] | None = None, **kw: Any
    ) -> Result:
        return self.execute(self.plan(actor, sql, params), **kw)

    def export(
        self, actor: Actor, sql: str, params: dict[str, Any] | None = None, fmt: str = "parquet"
    ) -> dict[str, Any]:
        """Runs the query under the export row limit and writes the result to the object store."""
        result = self.query(actor, sql, params, for_export=True)
        key = f"org/{actor.org_id}/exports/{time.strftime('%Y%m%d')}/{uuid.uuid4()}.{fmt}"
        self.store.put(key, formats.encode(result.table, fmt))
        return {
            "location": self.store.uri(key),
            "key": key,
            "format": fmt,
            "row_count": result.table.num_rows,
            "pinned": result.plan.versions,
            "elapsed_ms": round(result.elapsed_ms, 2),
        }

    def close(self) -> None:
        self.engine.close()


def _duck_message(e: Exception) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    head = lines[0] if lines else type(e).__name__
    where = next((ln for ln in lines[1:] if ln.startswith("LINE")), None)
    return f"{head} ({where.strip()})" if where else head
