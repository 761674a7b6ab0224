"""Query Service errors (mapped to HTTP statuses like every other error).

Statuses: a query stopped at a limit is 422 `limit_exceeded`, whichever limit it hit (time, CPU,
memory, result size, rows); `detail.limit` names it and the message says how to go on. A query
not admitted to the workers (admission.py) is 429 with `detail.retry_after_seconds`, which the
HTTP route also sends as `Retry-After`: `too_many_queries` (the user already has as many queries
running and waiting as one user may), `query_queue_full`, `query_queue_timeout` (its turn did not
come within the wait bound). A worker that could not be had or that died under the query for a
reason that is not one of its limits is 503 (try again)."""

from __future__ import annotations

from trace_platform.errors import TraceError

# What to do instead, per kind of limit: an interactive query that is too big goes to --export
# (its own, larger limits) or to a batch job; an export that is too big goes to a batch job.
BATCH = "run it as a batch job (operator sql_transform, on Spark)"
EXPORT = 'use --export ("export": true over HTTP) to write the result to the object store'


def human_size(n: int) -> str:
    if n < 1024:
        return f"{n:,} bytes"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.4g} {unit}"


class LimitExceeded(TraceError):
    """An interactive (or export) limit was hit; the message names it and points at the next
    step (`--export`, a `sql_transform` job)."""

    status_code = 422
    code = "limit_exceeded"

    # The limits a query can hit, as `detail.limit` names them.
    LIMITS = ("timeout_seconds", "cpu_seconds", "memory_limit", "max_result_bytes", "max_rows")

    @classmethod
    def hit(cls, limit: str, value: float | str, *, export: bool = False) -> LimitExceeded:
        which = "export" if export else "interactive"
        onward = BATCH if export else f"{EXPORT}, or {BATCH}"
        if limit == "max_rows":
            text = (
                f"the result has more than {int(value):,} rows (the {which} row limit): add a "
                f"LIMIT or an aggregate, {onward}"
            )
        elif limit == "max_result_bytes":
            text = (
                f"the result is larger than {human_size(int(value))} (the {which} result size "
                f"limit; the query was stopped): select fewer or narrower columns, add a LIMIT "
                f"or an aggregate, {onward}"
            )
        elif limit == "timeout_seconds":
            text = (
                f"the query ran past the {which} time limit of {float(value):g} s and was "
                f"stopped: narrow it, or {BATCH}"
            )
        elif limit == "cpu_seconds":
            text = (
                f"the query used more than its CPU time limit of {float(value):g} CPU-seconds "
                f"and was stopped: narrow it, or {BATCH}"
            )
        elif limit == "memory_limit":
            text = (
                f"the query needs more than the {which} memory limit ({value}) and was "
                f"stopped: narrow it (fewer columns, an earlier filter or aggregate), or {BATCH}"
            )
        else:
            raise ValueError(f"unknown limit {limit!r}")
        return cls(text, limit=limit, value=value)


class QueryFailed(TraceError):
    """DuckDB rejected or failed the statement (bad column, type error, …)."""

    status_code = 400
    code = "query_failed"


class NotAdmitted(TraceError):
    """The query was not let onto a worker (admission.py); `retry_after` is the whole seconds
    after which trying again makes sense (sent as `Retry-After`)."""

    status_code = 429
    code = "query_not_admitted"

    def __init__(self, message: str, *, retry_after: int, **detail: object) -> None:
        super().__init__(message, retry_after_seconds=retry_after, **detail)
        self.retry_after = retry_after


class TooManyQueries(NotAdmitted):
    """The caller already has as many queries running and waiting as one user may."""

    code = "too_many_queries"


class QueueFull(NotAdmitted):
    """The queue in front of the query workers holds as many queries as it may."""

    code = "query_queue_full"


class QueueTimeout(NotAdmitted):
    """The query's turn did not come within the queue's wait bound (nothing of it ran)."""

    code = "query_queue_timeout"


class QueryServiceBusy(TraceError):
    """An admitted query found no worker in time (one could not be started)."""

    status_code = 503
    code = "query_service_busy"


class WorkerDied(TraceError):
    """The query's worker process ended under it for a reason that is not one of its limits
    (killed from outside, crashed). It has been replaced; the API process never saw a result."""

    status_code = 503
    code = "query_worker_died"
