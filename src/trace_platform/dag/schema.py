"""The DAG file: pydantic models, so the JSON Schema (`trace dag schema`) is the same contract."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

NAME_RE = r"^[a-z][a-z0-9_]{0,127}$"
NAME = re.compile(NAME_RE)
RUNTIME_RE = r"^(ecs_[a-z][a-z0-9_]*|lambda)$"

# Fields the decisions note removed, and what to use instead.
FORBIDDEN: dict[str, str] = {
    "execution_strategy": "execution_strategy is not supported: model bulk work explicitly with "
    "the range_aggregator / range_splitter operators",
    "mode": "mode: live|backfill is not supported: rely on contextual time-gating "
    "(event_time, max_delivery_age) and idempotency instead",
}
FORBIDDEN_SCALING = {
    "mode": "scaling.mode is not supported: set scaling.max_concurrency (effective concurrency "
    "is min(max_concurrency, worker pool size))",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _reject_forbidden(data: Any, table: dict[str, str]) -> Any:
    """Removed fields fail with what to use instead, not a bare "unknown field"."""
    if isinstance(data, dict):
        for key, why in table.items():
            if key in data:
                raise ValueError(why)
    return data


class JobOutputRef(_Strict):
    """An input wired by index to another job's output."""

    job: str = Field(description="the producing job, in this DAG")
    output: int = Field(default=0, ge=0, description="which of its outputs (from 0)")
    triggers: bool = Field(
        default=True, description="false: read this input, but its events do not start the job"
    )


class DatasetSource(_Strict):
    dataset: str = Field(pattern=NAME_RE, description="the published dataset's name")


class SharedRead(_Strict):
    """An input read from a published dataset, possibly produced by another DAG."""

    from_: DatasetSource = Field(
        alias="from",
        description="`{dataset: NAME}`: a published dataset, possibly another DAG's (its `read_roles` must let the deployer read it)",
    )
    triggers: bool = Field(
        default=True, description="false: read this input, but its events do not start the job"
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _input_kind(data: Any) -> str:
    if isinstance(data, dict):
        return "shared" if "from" in data else "job"
    return "shared" if isinstance(data, SharedRead) else "job"


InputSpec = Annotated[
    Annotated[JobOutputRef, Tag("job")] | Annotated[SharedRead, Tag("shared")],
    Discriminator(_input_kind),
]


class OutputSpec(_Strict):
    backend: Literal["parquet", "postgres"] = Field(
        default="parquet",
        description="`parquet` (files in the object store) or `postgres` (a table)",
    )
    update_strategy: Literal["replace", "append"] = Field(
        default="replace",
        description="`replace` rewrites a scope and invalidates what was read from it downstream; `append` only inserts, deduplicated by `unique_key`",
    )
    unique_key: list[str] = Field(
        default_factory=list, description="the columns that identify a row (required with `append`)"
    )

    @model_validator(mode="after")
    def _append_needs_key(self) -> Self:
        if self.update_strategy == "append" and not self.unique_key:
            raise ValueError(
                "update_strategy: append needs unique_key (append only inserts, deduplicated by it)"
            )
        return self


class Scaling(_Strict):
    max_concurrency: int = Field(
        default=1,
        ge=1,
        le=10_000,
        description="at most this many tasks of the job at once (effective: min(max_concurrency, pool size))",
    )

    @model_validator(mode="before")
    @classmethod
    def _forbidden(cls, data: Any) -> Any:
        return _reject_forbidden(data, FORBIDDEN_SCALING)


class JobSpec(_Strict):
    operator: str = Field(
        min_length=1, description="the operator the job runs (see the operator reference)"
    )
    runtime: str = Field(
        default="ecs_platform",
        pattern=RUNTIME_RE,
        description="where it runs: `ecs_platform` (a platform worker), or `lambda` (the Lambda "
        "invoker invokes the function with the task's payload: see the Lambda runtime page)",
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="the operator's config, checked at deploy against its config model",
    )
    inputs: list[InputSpec] = Field(
        default_factory=list,
        description="what the job reads: another job's output, or a published dataset; an input's new data starts the job unless `triggers: false`",
    )
    outputs: list[OutputSpec] = Field(
        default_factory=list,
        description="the datasets the job writes, in order (`output` / `output_index` count from 0)",
    )
    timeout_seconds: int = Field(
        default=3600,
        gt=0,
        le=7 * 24 * 3600,
        description="an attempt running longer is ended and retried",
    )
    max_attempts: int = Field(
        default=3,
        gt=0,
        le=100,
        description="tries before the task fails for good (retries back off, capped and jittered)",
    )
    worker_pool: str | None = Field(
        default=None, description="the pool whose slots the job's tasks lease (none: no slot)"
    )
    scaling: Scaling = Field(
        default_factory=Scaling, description="how many of the job's tasks may run at once"
    )
    buffer_outputs: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="buffered datasets this job publishes batches to (it must be one of "
        "their writers)",
    )

    @model_validator(mode="before")
    @classmethod
    def _forbidden(cls, data: Any) -> Any:
        return _reject_forbidden(data, FORBIDDEN)

    def materialization(self) -> dict[str, Any]:
        """The fields whose change means different outputs (versus execution-only fields)."""
        out = self.model_dump(
            mode="json",
            include={"operator", "runtime", "config", "inputs", "outputs"},
            by_alias=True,
        )
        for inp in out["inputs"]:  # what wakes a job does not change what it writes
            inp.pop("triggers", None)
        return out


class PoolSlot(_Strict):
    env: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables of a task that holds this slot (e.g. `RPC_URL`)",
    )
    secrets: dict[str, str] = Field(default_factory=dict, description="env var -> secret name")


CRON_HORIZON_YEARS = 5


def check_schedule(schedule: str, now: datetime | None = None) -> datetime:
    """The next fire time of a cron schedule (5 fields, or 6 with seconds last), or ValueError
    saying why it has none: invalid syntax, or no fire time within CRON_HORIZON_YEARS (such as
    30 February), which the scheduler could never fire."""
    from croniter import croniter
    from croniter.croniter import CroniterError

    now = now or datetime.now(UTC)
    try:
        valid = croniter.is_valid(schedule)
        it = croniter(schedule, now)
    except (CroniterError, ValueError, TypeError, KeyError, OverflowError) as e:
        raise ValueError(f"'{schedule}' is not a valid cron expression ({e})") from None
    if not valid:
        raise ValueError(f"'{schedule}' is not a valid cron expression")
    horizon = now.replace(year=now.year + CRON_HORIZON_YEARS, day=min(now.day, 28))
    try:
        nxt: datetime = it.get_next(datetime)
    except (CroniterError, ValueError, OverflowError):
        nxt = horizon + timedelta(days=1)
    if nxt > horizon:
        raise ValueError(
            f"'{schedule}' has no fire time within {CRON_HORIZON_YEARS} years (a date such as "
            "30 February never comes): the scheduler could never fire it"
        )
    return nxt


class CronTrigger(_Strict):
    name: str = Field(pattern=NAME_RE, description="the trigger's name, unique in the DAG")
    schedule: str = Field(
        max_length=256,
        description="a cron expression; one that cannot fire within 5 years is refused",
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="the run config each firing passes to the source jobs"
    )

    @field_validator("schedule")
    @classmethod
    def _valid_cron(cls, v: str) -> str:
        check_schedule(v)
        return v


class WebhookTrigger(_Strict):
    name: str = Field(
        pattern=NAME_RE, description="the webhook's name: `POST /v1/hooks/{dag}/{name}`"
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="the run config (a request's JSON body is merged over it)"
    )


class Triggers(_Strict):
    cron: list[CronTrigger] = Field(
        default_factory=list, description="schedules (5 fields, or 6 with seconds last; UTC)"
    )
    webhooks: list[WebhookTrigger] = Field(
        default_factory=list, description="named webhooks: `POST /v1/hooks/{dag}/{name}`"
    )


class HotWindow(_Strict):
    """This (Postgres) dataset holds the most recent rows of a published Parquet dataset."""

    of: str = Field(pattern=NAME_RE, description="the cold dataset this window belongs to")
    key: str = Field(default="block_number", pattern=NAME_RE, description="the ordering column")


class PublishSpec(_Strict):
    job: str = Field(description="the job whose output is published")
    output_index: int = Field(default=0, ge=0, description="which of its outputs (from 0)")
    dataset: str = Field(
        description="the dataset name readers use (`^[a-z][a-z0-9_]{0,127}$`, unique in the org, one producing DAG)"
    )
    hot_window: HotWindow | None = Field(
        default=None,
        description="this Postgres dataset holds the newest rows of a Parquet one; the Query Service reads the two as one view",
    )


BUFFER_TYPES = ("text", "int64", "float64", "bool", "timestamp", "uint256", "json")
# Columns the sink writes itself: never declared, never taken from a batch's rows.
BUFFER_RESERVED = frozenset({"org_id", "record_id", "loaded_at"})


class BufferColumn(_Strict):
    name: str = Field(
        pattern=NAME_RE,
        max_length=63,  # Postgres cuts longer identifiers: two names could become one column
        description="the column's name",
    )
    type: Literal["text", "int64", "float64", "bool", "timestamp", "uint256", "json"] = Field(
        description="uint256: an exact amount (JSON integer or decimal text, or limbs), "
        "stored as numeric(78,0); timestamp: ISO 8601 or epoch seconds"
    )
    required: bool = Field(default=True, description="false: a row may leave it out (NULL)")


class BufferedDataset(_Strict):
    """A multi-writer Postgres dataset: producer jobs publish batches, the trusted sink loads
    them, deduplicated by `unique_key`. Its rows stay through deploys and rollbacks."""

    name: str = Field(pattern=NAME_RE, description="the dataset's name in the org")
    columns: list[BufferColumn] = Field(
        min_length=1, max_length=200, description="the columns every batch row is checked against"
    )
    unique_key: list[str] = Field(
        min_length=1,
        max_length=16,
        description="the columns that identify a row: a row whose key is stored is skipped",
    )
    writers: list[str] = Field(
        min_length=1,
        max_length=100,
        description="'dag.job' of every job allowed to publish to it (any DAG of the org)",
    )
    max_rows: int = Field(default=100_000, ge=1, le=10_000_000, description="rows per batch")
    max_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1, le=1024 * 1024 * 1024, description="bytes per batch"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [c.name for c in self.columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"column names repeat: {', '.join(dup)}")
        reserved = sorted(BUFFER_RESERVED & set(names))
        if reserved:
            raise ValueError(f"{', '.join(reserved)}: reserved (the sink writes it)")
        missing = [k for k in self.unique_key if k not in names]
        if missing:
            raise ValueError(f"unique_key names no column: {', '.join(missing)}")
        optional = [c.name for c in self.columns if c.name in self.unique_key and not c.required]
        if optional:
            raise ValueError(f"unique_key columns must be required: {', '.join(optional)}")
        for w in self.writers:
            dag, _, job = w.partition(".")
            if not (NAME.fullmatch(dag) and job):
                raise ValueError(f"writer {w!r} is not 'dag.job'")
        return self


class DagSpec(_Strict):
    name: str = Field(
        pattern=NAME_RE,
        description="the DAG's name, unique in its org: it names its runs, webhooks and status",
    )
    description: str | None = Field(
        default=None, description="free text, shown by `trace dag show`"
    )
    jobs: dict[str, JobSpec] = Field(
        min_length=1,
        description="the jobs, by name (a job name is what inputs, publish and status use)",
    )
    publish: list[PublishSpec] = Field(
        default_factory=list, description="which job outputs are published as named datasets"
    )
    worker_pools: dict[str, list[PoolSlot]] = Field(
        default_factory=dict,
        description="named pools: each a list of slots; a job in a pool runs only while it holds one of its slots (and gets that slot's env and secrets)",
    )
    triggers: Triggers = Field(
        default_factory=Triggers,
        description="what starts the DAG's source jobs (those that read no input)",
    )
    buffered: list[BufferedDataset] = Field(
        default_factory=list,
        max_length=100,
        description="multi-writer Postgres datasets this DAG declares (loaded by the sink)",
    )

    @model_validator(mode="before")
    @classmethod
    def _forbidden(cls, data: Any) -> Any:
        return _reject_forbidden(data, FORBIDDEN)
