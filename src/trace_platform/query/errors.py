"""Query Service errors (mapped to HTTP statuses like every other error)."""

from __future__ import annotations

from trace_platform.dispatcher.errors import DispatcherError


class LimitExceeded(DispatcherError):
    """An interactive limit was hit; the message points at the batch path."""

    status_code = 422
    code = "limit_exceeded"


class QueryFailed(DispatcherError):
    """DuckDB rejected or failed the statement (bad column, type error, …)."""

    status_code = 400
    code = "query_failed"
