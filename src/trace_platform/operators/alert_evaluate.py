"""alert_evaluate: alert rules over the job's inputs, each one guarded Spark SQL read query (the
same guard, plan check and u256 helpers as `sql_transform`, over the same input views and
`:<view>_first_block` / `:<view>_last_block` parameters). Every row a rule returns is an alert:

- `event_time`: when it happened on chain (the triggering block's timestamp; a TIMESTAMP or
  epoch seconds) — what routing's `max_delivery_age` is measured from;
- `severity`: `info`, `warning` or `critical`;
- `dedupe_key`: deterministic text naming the alert (e.g. the transfer's tx hash and log
  index), so a rerun over the same data raises the same alert, stored once;
- `payload` (optional): a struct, map or JSON text; without one, the row's other columns are
  the payload (amount limbs as exact decimal text).

The alerts are written, through the attempt's buffer prefix and the wrapper's fenced publish,
to the org's shared `alert_events` buffered dataset (created at deploy, its writers the org's
alert_evaluate jobs), deduplicated by (dag, job, rule, dedupe_key): "would have alerted" is
always recorded, whatever routing does with it. The task emits no other output."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trace_platform.alerts.datasets import ALERT_EVENTS, SEVERITIES
from trace_platform.dag.schema import NAME_RE
from trace_platform.operators.config import OperatorConfig
from trace_platform.operators.context import OperatorContext, OperatorResult, PermanentError
from trace_platform.operators.sql_transform import bind_args, register_views, synced_blocks
from trace_platform.spark.sql_guard import CheckedQuery, check_query
from trace_platform.spark.sql_plan_check import check_spark_plan, plan_parser
from trace_platform.spark.u256 import BASE, FIELDS, TOP

REQUIRED = ("event_time", "severity", "dedupe_key")
MAX_KEY = 512


class AlertRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_RE, description="the rule's name (alerts carry it)")
    sql: str = Field(
        description="one Spark SQL read query over the input views returning event_time, "
        "severity, dedupe_key (and payload)"
    )
    args: dict[str, Any] | None = Field(
        default=None, description="named parameter markers (:name) -> values"
    )

    @field_validator("sql")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("is blank: a rule needs a Spark SQL SELECT")
        return v


class AlertEvaluateConfig(OperatorConfig):
    rules: list[AlertRule] = Field(min_length=1, max_length=32, description="the alert rules")
    max_alerts: int = Field(
        default=10_000, ge=1, le=1_000_000, description="alerts one rule may raise per task"
    )

    @model_validator(mode="after")
    def _unique(self) -> AlertEvaluateConfig:
        names = [r.name for r in self.rules]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rule names repeat: {', '.join(dup)}")
        return self

    def job_problems(self, inputs: int, outputs: int) -> list[tuple[str, str]]:
        if outputs:
            return [("outputs", "alert_evaluate writes the org's alert_events only")]
        return []


def alert_evaluate(ctx: OperatorContext) -> OperatorResult:
    cfg = AlertEvaluateConfig.from_ctx(ctx)
    views = [ref.dataset_name or f"input_{i}" for i, ref in enumerate(ctx.task.inputs)]
    checked: list[tuple[AlertRule, CheckedQuery]] = []
    for rule in cfg.rules:  # every rule's SQL is refused or accepted before any input is read
        try:
            checked.append((rule, check_query(rule.sql, views)))
        except PermanentError as e:
            raise PermanentError(f"rule '{rule.name}': {e}") from None
    synced = synced_blocks(ctx, views)
    bound = [
        (rule, c, bind_args(c, synced, rule.args, f"rule '{rule.name}' args", "alert_evaluate"))
        for rule, c in checked
    ]
    parser = plan_parser(ctx.spark)
    for _rule, c in checked:
        check_spark_plan(parser, c)
    register_views(ctx, views)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for rule, c, args in bound:
        for alert in _run(ctx, rule, c, args, cfg.max_alerts):
            rows.setdefault((alert["rule"], alert["dedupe_key"]), alert)
    if rows:
        pd = ALERT_EVENTS
        ctx.publish_rows(pd.name, rows.values(), max_rows=pd.max_rows, max_bytes=pd.max_bytes)
    ctx.progress(alerts=len(rows))
    return OperatorResult()


def _run(
    ctx: OperatorContext,
    rule: AlertRule,
    c: CheckedQuery,
    args: dict[str, Any] | None,
    limit: int,
) -> list[dict[str, Any]]:
    try:
        frame = ctx.spark.sql(c.sql, args=args)
    except Exception as e:
        if type(e).__name__ in ("AnalysisException", "ParseException"):
            from trace_platform.spark import spark_error_text

            raise PermanentError(f"rule '{rule.name}': {spark_error_text(e)}") from None
        raise
    missing = [col for col in REQUIRED if col not in frame.columns]
    if missing:
        raise PermanentError(
            f"rule '{rule.name}' returns no {', '.join(missing)} column "
            "(a rule returns event_time, severity, dedupe_key and a payload)"
        )
    if frame.schema["event_time"].dataType.typeName().startswith("timestamp"):
        # Exact and free of the Python process's time zone: microseconds since the epoch.
        frame = frame.withColumn("event_time", _micros(frame["event_time"]))
        micros = True
    else:
        micros = False
    got = frame.limit(limit + 1).collect()
    if len(got) > limit:
        raise PermanentError(f"rule '{rule.name}' raised more than max_alerts={limit} alerts")
    dag_id = str(ctx.task.dag_id or "")
    out = []
    for r in got:
        row = r.asDict(recursive=True)
        if micros and row["event_time"] is not None:
            row["event_time"] = Decimal(row["event_time"]) / 1_000_000
        out.append(alert_row(rule.name, row, dag_id, ctx.task.job))
    return out


def _micros(col: Any) -> Any:
    from pyspark.sql import functions as F

    return F.unix_micros(col.cast("timestamp"))


def alert_row(rule: str, row: dict[str, Any], dag_id: str, job: str) -> dict[str, Any]:
    """One alert_events row of what a rule returned (a PermanentError naming what is wrong)."""
    severity = row.pop("severity")
    if not isinstance(severity, str) or severity.lower() not in SEVERITIES:
        raise PermanentError(
            f"rule '{rule}': severity {severity!r} is not one of {', '.join(SEVERITIES)}"
        )
    key = row.pop("dedupe_key")
    if key is None or not str(key) or len(str(key)) > MAX_KEY:
        raise PermanentError(f"rule '{rule}': dedupe_key must be 1 to {MAX_KEY} characters")
    when = _event_time(rule, row.pop("event_time"))
    payload = row.pop("payload") if "payload" in row else row
    if isinstance(payload, str):
        with contextlib.suppress(ValueError):  # plain text is a payload too
            payload = json.loads(payload)
    return {
        "dag_id": dag_id,
        "job": job,
        "rule": rule,
        "dedupe_key": str(key),
        "severity": severity.lower(),
        "event_time": when,
        "payload": plain(payload),
    }


def _event_time(rule: str, v: Any) -> str:
    if isinstance(v, datetime):
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).astimezone(UTC).isoformat()
    if isinstance(v, int | float | Decimal) and not isinstance(v, bool):
        return datetime.fromtimestamp(float(v), UTC).isoformat()
    raise PermanentError(
        f"rule '{rule}': event_time {v!r} is not a timestamp or epoch seconds (the triggering "
        "block's timestamp)"
    )


def plain(v: Any) -> Any:
    """A value as JSON: amount limbs as exact decimal text, times as ISO 8601."""
    if isinstance(v, dict):
        if set(v) == set(FIELDS) and all(isinstance(x, int) for x in v.values()):
            return str(sum(int(v[f]) * BASE ** (TOP - i) for i, f in enumerate(FIELDS)))
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, bytes | bytearray):
        return "0x" + bytes(v).hex()
    if isinstance(v, float) and v != v:
        return None
    return v
