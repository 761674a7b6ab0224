"""sql_transform: one Spark SQL read query over the task's input datasets, each registered as a
view of its pinned version (named like the dataset, else `input_{i}`), into output 0.
`config.args` binds named parameter markers (`:window_blocks`) so values stay out of the SQL.
Each input also offers `:<view>_first_block` and `:<view>_last_block`: the blocks its committed
ranges span (NULL when it has none), so an analytic never reports past the synced data.

User SQL is untrusted: before any input is fetched, `trace_platform.spark.sql_guard` accepts
only one read query over those views (no TRANSFORM … USING, no reflect/java_method, no file
paths, no DDL/DML, SET, CACHE, ADD JAR, function creation, …) and a refusal fails the task at
once, naming what was refused. Spark then runs the SQL regenerated from the checked tree, not
the user's text, after its own parser agrees (`check_spark_plan`).

Exact amounts (`trace_platform.spark.u256`): amount columns are limbs structs, in the inputs
and in the output alike; the SQL computes with the u256 helpers (`u256_sum(value)`, …). A text
that `u256()` cannot read as an integer fails the task, naming it.

The batch path for heavy SQL (the Query Service stays interactive). The output version is
rewritten as a whole: scope `all`."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from trace_platform.operators.config import OperatorConfig
from trace_platform.operators.context import OperatorContext, OperatorResult, PermanentError
from trace_platform.operators.inputs import read_frame, version_locations
from trace_platform.operators.output import publish_frame
from trace_platform.spark import u256
from trace_platform.spark.sql_guard import CheckedQuery, check_query
from trace_platform.spark.sql_plan_check import check_spark_plan, plan_parser


class SqlTransformConfig(OperatorConfig):
    sql: str = Field(description="one Spark SQL read query over the input views")
    args: dict[str, Any] | None = Field(
        default=None, description="named parameter markers (:name) -> values"
    )

    @field_validator("sql")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("is blank: sql_transform needs a Spark SQL SELECT")
        return v

    def job_problems(self, inputs: int, outputs: int) -> list[tuple[str, str]]:
        return [] if outputs else [("outputs", "sql_transform needs one output")]


def synced_blocks(ctx: OperatorContext, views: list[str]) -> dict[str, int | None]:
    """`<view>_first_block` / `<view>_last_block` for every input: the first block of the
    ranges committed in its pinned version and the last one they hold without a gap from there
    (blocks past a gap are not synced through; None for an input with no range commits)."""
    out: dict[str, int | None] = {}
    for ref, view in zip(ctx.task.inputs, views, strict=True):
        spans = sorted(
            (c.range.start, c.range.end)
            for c in ctx.task.committed
            if c.dataset_version == ref.dataset_version and c.range is not None
        )
        first = last = None
        if spans:
            first, end = spans[0]
            for start, stop in spans[1:]:
                if start > end:
                    break
                end = max(end, stop)
            last = end - 1
        out[f"{view}_first_block"] = first
        out[f"{view}_last_block"] = last
    return out


def bind_args(
    checked: CheckedQuery,
    synced: dict[str, int | None],
    args: dict[str, Any] | None,
    where: str,
    operator: str,
) -> dict[str, Any] | None:
    """The parameters a checked query uses: the synced blocks and the config's `args`, which
    may not name a synced one (what the data holds is not the config's to say)."""
    taken = sorted(set(args or {}) & set(synced))
    if taken:
        raise PermanentError(
            f"{where}: {', '.join(taken)}: set by {operator} from the input's committed "
            "ranges; name your own parameter otherwise"
        )
    given = {**synced, **(args or {})}
    return {k: v for k, v in given.items() if k in checked.parameters} or None


def register_views(ctx: OperatorContext, views: list[str]) -> list[tuple[int, str]]:
    """Each input as its view, read from exactly its committed scopes' files (never every
    attempt's under the version); returns the inputs with no rows to read, e.g. a range
    aggregator's manifests (they wake the job, they hold no rows)."""
    empty: list[tuple[int, str]] = []
    for i, ref in enumerate(ctx.task.inputs):
        frame = read_frame(ctx, version_locations(ctx, ref), f"input_{i}")
        if frame is not None:
            frame.createOrReplaceTempView(views[i])
        else:
            empty.append((i, views[i]))
    return empty


def sql_transform(ctx: OperatorContext) -> OperatorResult:
    cfg = SqlTransformConfig.from_ctx(ctx)
    if not ctx.task.outputs:
        raise PermanentError("sql_transform needs one output")
    views = [ref.dataset_name or f"input_{i}" for i, ref in enumerate(ctx.task.inputs)]
    checked = check_query(cfg.sql, views)  # refuses anything but one read query over `views`
    synced = synced_blocks(ctx, views)
    args = bind_args(checked, synced, cfg.args, "sql_transform config.args", "sql_transform")
    spark = ctx.spark  # a task session: hardened (trace_platform.spark)
    check_spark_plan(plan_parser(spark), checked)
    assert all(ref.location is not None for ref in ctx.task.inputs)
    empty = register_views(ctx, views)
    try:
        frame = spark.sql(checked.sql, args=args)  # the checked text, not the user's
    except Exception as e:  # analysis/parse errors: no retry can fix the statement
        if type(e).__name__ in ("AnalysisException", "ParseException"):
            from trace_platform.spark import spark_error_text

            text = spark_error_text(e)
            for i, view in empty:
                if f"`{view}`" in text:
                    raise PermanentError(
                        f"input {i} ({view}) has no data in its pinned version yet"
                    ) from None
            raise PermanentError(f"Spark SQL: {text}") from None
        raise
    with u256.invalid_amounts_fail():
        return publish_frame(ctx, frame)
