"""hot_window: the trusted sink that keeps the most recent blocks of a dataset in Postgres data.

Each task loads one range of one input (the one whose event woke it) into the matching output's
UUID-named table with COPY, in one transaction: the range's old rows go first (so a re-run
replaces rather than adds), rows below the window are never loaded, and rows that fell out of the
window are trimmed. A `published.<name>` view follows the table. Only the worker gives this
operator a data DSN (`TRACE_SINK_DSN`), and only as runtime ecs_platform: on the embedded cluster
the least-privilege login `trace_sink` (migration 0010), which has no CREATE on the database and
makes a dataset's schema through `trace_sink_ddl.ensure_schema` only."""

from __future__ import annotations

import io
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from psycopg import sql
from pydantic import Field

from trace_platform.contract import DatasetRef, EventIn, OutputCommit, RangeSpec
from trace_platform.dag.schema import NAME_RE
from trace_platform.operators.config import OperatorConfig
from trace_platform.operators.context import OperatorContext, OperatorResult, PermanentError
from trace_platform.operators.inputs import parquet_keys, scope_location


class HotWindowConfig(OperatorConfig):
    window_blocks: int = Field(default=1000, ge=1, le=2**62, description="the newest N blocks")
    key: str = Field(default="block_number", pattern=NAME_RE, description="the ordering column")

    def job_problems(self, inputs: int, outputs: int) -> list[tuple[str, str]]:
        if outputs < inputs:
            return [
                (
                    "outputs",
                    f"hot_window maps input i to output i: {inputs} inputs need as many "
                    f"Postgres outputs (it has {outputs})",
                )
            ]
        return []


def pg_type(t: pa.DataType) -> str:
    """The Postgres column type that holds every value of an Arrow type exactly."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return "smallint" if not pa.types.is_uint8(t) else "integer"
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return "integer"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "bigint"
    if pa.types.is_uint64(t):
        return "numeric(20,0)"
    if pa.types.is_floating(t):
        return "double precision"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytea"
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz else "timestamp"
    if pa.types.is_date(t):
        return "date"
    return "jsonb"


def _read_range(ctx: OperatorContext, ref: DatasetRef) -> pa.Table | None:
    """The input event's range as committed (that commit's own files, not every attempt's)."""
    location = scope_location(ctx, ref)
    if location is None:
        return None
    tables = [pq.read_table(io.BytesIO(ctx.store.get(k))) for k in parquet_keys(ctx, [location])]
    return pa.concat_tables(tables, promote_options="default") if tables else None


def _ensure_schema(conn: psycopg.Connection[Any], name: str) -> None:
    """The schema `name`, made if missing: through migration 0010's function where the database
    has it (the sink's login may not CREATE SCHEMA itself), else directly (a data database that
    never ran Trace's migrations)."""
    has_function = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'trace_sink_ddl' AND p.proname = 'ensure_schema')"
    ).fetchone()
    if has_function and has_function[0]:
        conn.execute("SELECT trace_sink_ddl.ensure_schema(%s)", [name])
    else:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(name)))


def _cell(v: Any) -> Any:
    if isinstance(v, dict | list):
        return psycopg.types.json.Jsonb(v)
    return v


def hot_window(ctx: OperatorContext) -> OperatorResult:
    dsn = ctx.env.get("TRACE_SINK_DSN")
    if not dsn:
        raise PermanentError(
            "hot_window is a trusted sink: it runs only as runtime ecs_platform on a platform "
            "worker (which gives it Postgres data access)"
        )
    event = ctx.task.input_event or {}
    rng = event.get("range")
    if not rng:
        raise PermanentError("hot_window needs a range event from its input job")
    start, end = int(rng["start"]), int(rng["end"])
    src = next(
        (
            i
            for i, ref in enumerate(ctx.task.inputs)
            if str(ref.dataset_uuid) == event.get("dataset_uuid")
        ),
        None,
    )
    if src is None or src >= len(ctx.task.outputs):
        raise PermanentError(
            "hot_window maps input i to output i: give it as many Postgres outputs as inputs"
        )
    inp, out = ctx.task.inputs[src], ctx.task.outputs[src]
    if out.backend != "postgres":
        raise PermanentError(f"hot_window output {src} must have backend: postgres")
    assert inp.location is not None and out.location is not None
    cfg = HotWindowConfig.from_ctx(ctx)
    window, key = cfg.window_blocks, cfg.key
    data = _read_range(ctx, inp)
    if data is not None and key not in data.column_names:
        raise PermanentError(f"input {src} has no column '{key}' (config.key)")
    loaded = load_range(dsn, out.location, out.dataset_name, data, start, end, window, key)
    span = RangeSpec(start=start, end=end)
    return OperatorResult(
        events=[
            EventIn(
                dataset_uuid=out.dataset_uuid,
                range=span,
                payload={"rows": loaded, "table": out.location},
            )
        ],
        outputs=[
            OutputCommit(
                dataset_uuid=out.dataset_uuid,
                dataset_version=out.dataset_version,
                range=span,
                location=out.location,
                row_count=loaded,
            )
        ],
    )


def load_range(
    dsn: str,
    location: str,
    dataset_name: str | None,
    data: pa.Table | None,
    start: int,
    end: int,
    window: int,
    key: str = "block_number",
) -> int:
    """Loads one half-open range [start, end) into the window table `location` ("schema.table") in one transaction;
    returns the rows kept. Idempotent: the range's rows are replaced, never added to."""
    schema_name, _, table_name = location.partition(".")
    table = sql.Identifier(schema_name, table_name)
    k = sql.Identifier(key)
    loaded = 0
    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [location])
        _ensure_schema(conn, schema_name)
        if data is None:
            return 0
        cols = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(pg_type(f.type)))
            for f in data.schema
        )
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(table, cols))
        for f in data.schema:  # columns added upstream appear here too
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                    table, sql.Identifier(f.name), sql.SQL(pg_type(f.type))
                )
            )
        conn.execute(
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
                sql.Identifier(f"{table_name}_{key}_idx"), table, k
            )
        )
        top = conn.execute(sql.SQL("SELECT max({}) FROM {}").format(k, table)).fetchone()
        high = max(end - 1, int(top[0]) if top and top[0] is not None else end - 1)
        floor = high - window + 1
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE {} >= %s AND {} < %s").format(table, k, k), [start, end]
        )
        kt = data.schema.field(key).type
        lowest = max(floor, 0) if pa.types.is_unsigned_integer(kt) else floor
        keep = data.filter(pc.greater_equal(data[key], pa.scalar(lowest, kt)))
        loaded = keep.num_rows
        if loaded:
            names = sql.SQL(", ").join(sql.Identifier(n) for n in keep.column_names)
            columns = [keep.column(i).to_pylist() for i in range(keep.num_columns)]
            with conn.cursor().copy(
                sql.SQL("COPY {} ({}) FROM STDIN").format(table, names)
            ) as copy:
                for row in zip(*columns, strict=True):
                    copy.write_row([_cell(v) for v in row])
        conn.execute(sql.SQL("DELETE FROM {} WHERE {} < %s").format(table, k), [floor])
        if dataset_name:
            _ensure_schema(conn, "published")
            conn.execute(
                sql.SQL("CREATE OR REPLACE VIEW {} AS SELECT * FROM {}").format(
                    sql.Identifier("published", dataset_name), table
                )
            )
    return loaded
