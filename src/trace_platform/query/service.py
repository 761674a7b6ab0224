"""The Query Service: SQL over published datasets, each pinned at query start, in DuckDB.

`plan` screens the statement and pins every dataset it names (read_roles enforced), in this
process; `execute` runs it against exactly those pins, so a cutover during a query does not move
it, in a worker process under kernel limits (pool.py, runner.py), never in this one.

Limits (all configurable, TRACE_QUERY_*): time (DuckDB interrupt at timeout_seconds, SIGKILL at
timeout + kill grace), CPU (RLIMIT_CPU), memory (DuckDB memory_limit, and RLIMIT_AS at the
worker's baseline + memory_limit + headroom), result size (rows and Arrow bytes, measured in the
worker). A limit hit answers 422 `limit_exceeded` naming it in `detail.limit` with what to do
instead (`--export`, a `sql_transform` job). In front of the workers, admission (admission.py)
keeps each user and org to its share and queues the rest; the time limit starts on the worker,
not in the queue."""

from __future__ import annotations

import signal
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from uuid import UUID

import pyarrow as pa
from psycopg_pool import ConnectionPool

from trace_platform.config import ObjectStoreBackend, Settings
from trace_platform.errors import Invalid
from trace_platform.identity import Actor
from trace_platform.objectstore import ObjectStore
from trace_platform.query import catalog, formats, guard
from trace_platform.query.admission import Admission
from trace_platform.query.engine import Limits, S3Access, check_pins
from trace_platform.query.errors import (
    BATCH,
    LimitExceeded,
    QueryFailed,
    QueryServiceBusy,
    WorkerDied,
)
from trace_platform.query.pool import NoWorker, WorkerConfig, WorkerPool, WorkerStopped, parse_size

PIN_MARGIN_SECONDS = 60.0


@dataclass
class Plan:
    actor: Actor
    sql: str
    params: dict[str, Any]
    pins: dict[str, catalog.Pin]
    pinned_at: float = field(default_factory=time.time)
    query_id: UUID | None = None  # its lease on the pinned files (query_pins), ended by execute

    @property
    def versions(self) -> dict[str, str]:
        return {n: str(p.version) for n, p in sorted(self.pins.items())}


@dataclass
class Result:
    table: pa.Table
    plan: Plan
    elapsed_ms: float  # on its worker (what the time limit counts)
    queued_ms: float = 0.0  # waiting for its turn (admission.py), before that

    def as_json(self) -> dict[str, Any]:
        return {
            "columns": formats.columns(self.table),
            "rows": formats.rows(self.table),
            "row_count": self.table.num_rows,
            "pinned": self.plan.versions,
            "elapsed_ms": round(self.elapsed_ms, 2),
            "queued_ms": round(self.queued_ms, 2),
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
    """Plans in this process (guard, registry, pins, read_roles: trusted), executes in a worker
    process (pool.py, runner.py) under kernel limits: user SQL never runs in the API process."""

    def __init__(
        self, pool: ConnectionPool, store: ObjectStore, pg_dsn: str, settings: Settings
    ) -> None:
        self.pool = pool
        self.store = store
        self.settings = settings
        self.pg_dsn = pg_dsn  # the least-privilege reader; only workers use it
        self.s3 = s3_access(settings)
        self.limits = Limits(
            timeout_seconds=settings.query_timeout_seconds,
            max_rows=settings.query_max_rows,
            memory_limit=settings.query_memory_limit,
            threads=settings.query_threads,
            max_result_bytes=settings.query_max_result_bytes,
        )
        self.admission = Admission(
            workers=settings.query_workers,
            per_user=settings.query_max_per_user,
            per_org=settings.query_max_per_org,
            queue_size=settings.query_queue_size,
            queued_per_user=settings.query_max_queued_per_user,
            wait_seconds=settings.query_queue_wait_seconds,
        )
        self.workers = WorkerPool(
            settings.query_workers,
            WorkerConfig(
                pg_dsn=pg_dsn,
                s3=asdict(self.s3) if self.s3 else None,
                memory_limit_bytes=parse_size(settings.query_memory_limit),
                headroom_bytes=parse_size(settings.query_memory_headroom),
            ),
            kill_grace=settings.query_kill_grace_seconds,
        )

    def _worker_wait(self) -> float:
        """How long an admitted query waits for a worker: admission keeps no more queries
        running than there are workers, so at most while one (re)starts."""
        return self.workers.config.start_timeout

    def _lease_seconds(self) -> float:
        """How long a pin may live: the wait in the queue, for a worker, and the run (time
        limit, then the kill grace) are each bounded; the margin covers listing the files."""
        s = self.settings
        return (
            s.query_queue_wait_seconds
            + self._worker_wait()
            + s.query_timeout_seconds
            + s.query_kill_grace_seconds
            + PIN_MARGIN_SECONDS
        )

    def plan(self, actor: Actor, sql: str, params: dict[str, Any] | None = None) -> Plan:
        """Pins under a lease taken first; `execute` (or `export`) ends it, else it expires."""
        names = guard.dataset_names(sql)
        query_id = uuid.uuid4()
        catalog.lease(self.pool, query_id, self._lease_seconds())
        try:
            pins = catalog.pin(self.pool, self.store, actor, names)
            check_pins(pins, self.s3)
        except BaseException:
            catalog.release(self.pool, query_id)
            raise
        return Plan(actor, sql, params or {}, pins, query_id=query_id)

    def release(self, plan: Plan) -> None:
        """The query is done with its pinned files (the collector may delete them once retired)."""
        if plan.query_id is not None:
            catalog.release(self.pool, plan.query_id)

    def _limits(
        self, *, export: bool, max_rows: int | None, timeout_seconds: float | None
    ) -> Limits:
        """Caller limits may only lower the service's; an export has its own, larger caps."""
        lim, s = self.limits, self.settings
        rows = s.query_export_max_rows if export else lim.max_rows
        timeout = lim.timeout_seconds
        if timeout_seconds is not None:
            timeout = min(timeout_seconds, timeout)
        return replace(
            lim,
            timeout_seconds=timeout,
            max_rows=min(max_rows or rows, rows),
            max_result_bytes=s.query_export_max_result_bytes if export else lim.max_result_bytes,
        )

    def _cpu_seconds(self, limits: Limits) -> float:
        if self.settings.query_cpu_seconds is not None:
            return self.settings.query_cpu_seconds
        return (limits.timeout_seconds + self.settings.query_kill_grace_seconds) * limits.threads

    def _run(
        self,
        plan: Plan,
        *,
        fmt: str,
        export: bool,
        max_rows: int | None,
        timeout_seconds: float | None,
    ) -> tuple[dict[str, Any], bytearray, float, float]:
        """Runs the plan on a worker once admitted: (answer header, payload, ms on the worker,
        ms waiting for the turn), or the error (NotAdmitted: 429, nothing ran)."""
        limits = self._limits(export=export, max_rows=max_rows, timeout_seconds=timeout_seconds)
        cpu = self._cpu_seconds(limits)
        request = {
            "sql": plan.sql,
            "params": plan.params,
            "pins": [p.to_json() for p in plan.pins.values()],
            "limits": asdict(limits),
            "cpu_seconds": cpu,
            "format": fmt,
            "export": export,
        }
        hold = limits.timeout_seconds + self.settings.query_kill_grace_seconds
        with self.admission.slot(plan.actor, hold) as waited:
            t0 = time.perf_counter()  # from admission: the wait in the queue is apart
            try:
                header, payload = self.workers.run(
                    request,
                    timeout=limits.timeout_seconds,
                    wait=self._worker_wait(),
                    # The worker measured its answer against the cap; this is a backstop (IPC
                    # framing adds a little to the Arrow buffers).
                    max_payload=limits.max_result_bytes + (1 << 20),
                )
            except NoWorker as e:
                raise QueryServiceBusy(f"{e}: try again shortly") from None
            except WorkerStopped as e:
                raise _stopped(e, limits, cpu, export=export) from None
        if not header.get("ok"):
            raise _failed(header, limits, export=export)
        return header, payload, (time.perf_counter() - t0) * 1000, waited * 1000

    def execute(
        self,
        plan: Plan,
        *,
        max_rows: int | None = None,
        timeout_seconds: float | None = None,
        for_export: bool = False,
    ) -> Result:
        """Runs the plan out of process and decodes the (capped) Arrow answer."""
        try:
            _, payload, elapsed, queued = self._run(
                plan,
                fmt="arrow",
                export=for_export,
                max_rows=max_rows,
                timeout_seconds=timeout_seconds,
            )
        finally:
            self.release(plan)
        table = pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
        return Result(table, plan, elapsed, queued)

    def query(
        self, actor: Actor, sql: str, params: dict[str, Any] | None = None, **kw: Any
    ) -> Result:
        return self.execute(self.plan(actor, sql, params), **kw)

    def export(
        self, actor: Actor, sql: str, params: dict[str, Any] | None = None, fmt: str = "parquet"
    ) -> dict[str, Any]:
        """Runs the query in a worker under the export limits (rows, bytes); the worker encodes
        the file, this process writes it to the object store."""
        if fmt not in ("parquet", "csv"):
            raise Invalid(f"an export is parquet or csv (got '{fmt}')")
        plan = self.plan(actor, sql, params)
        try:
            header, payload, elapsed, queued = self._run(
                plan, fmt=fmt, export=True, max_rows=None, timeout_seconds=None
            )
        finally:
            self.release(plan)
        key = f"org/{actor.org_id}/exports/{time.strftime('%Y%m%d')}/{uuid.uuid4()}.{fmt}"
        self.store.put(key, bytes(payload))
        return {
            "location": self.store.uri(key),
            "key": key,
            "format": fmt,
            "row_count": int(header["rows"]),
            "pinned": plan.versions,
            "elapsed_ms": round(elapsed, 2),
            "queued_ms": round(queued, 2),
        }

    def close(self) -> None:
        self.workers.close()


def _stopped(e: WorkerStopped, limits: Limits, cpu: float, *, export: bool) -> Exception:
    """A worker that gave no answer: which limit stopped it, or that it died."""
    if e.reason == "timeout":
        return LimitExceeded.hit("timeout_seconds", limits.timeout_seconds, export=export)
    if e.reason == "oversize":
        return LimitExceeded.hit("max_result_bytes", limits.max_result_bytes, export=export)
    if e.returncode == -signal.SIGXCPU:
        return LimitExceeded.hit("cpu_seconds", cpu, export=export)
    rc = e.returncode
    how = f"killed by {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit {rc}"
    return WorkerDied(
        f"the query's worker process ended before it answered ({how}); it has been replaced "
        "and nothing of its result was used. Run the query again; if it happens again, the "
        f"query likely needs more than the memory limit ({limits.memory_limit}): narrow it, "
        f"or {BATCH}",
        signal=how,
    )


def _failed(header: dict[str, Any], limits: Limits, *, export: bool) -> Exception:
    """A worker's error answer as the error the caller sees (messages are built here)."""
    kind = header.get("kind")
    if kind == "limit" and header.get("limit") in LimitExceeded.LIMITS:
        value = {
            "timeout_seconds": limits.timeout_seconds,
            "memory_limit": limits.memory_limit,
            "max_result_bytes": limits.max_result_bytes,
        }.get(str(header["limit"]), header.get("value"))
        if not isinstance(value, int | float | str):
            value = str(value)
        return LimitExceeded.hit(str(header["limit"]), value, export=export)
    message = str(header.get("message") or "the query failed")[:4000]
    if kind == "invalid":
        err = Invalid(message)
        err.code = str(header.get("code") or err.code)
        return err
    if kind == "query_failed":
        return QueryFailed(message)
    return QueryFailed(f"the query worker failed: {message}")
