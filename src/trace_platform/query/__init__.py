"""The Query Service: interactive SQL over published datasets, hot Postgres and cold Parquet.

Names are resolved lazily, so a query worker (runner.py) imports only what it runs with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trace_platform.query.service import Plan, QueryService, Result

__all__ = ["Plan", "QueryService", "Result"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from trace_platform.query import service

        return getattr(service, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
