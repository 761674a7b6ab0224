"""The Query Service: interactive SQL over published datasets, hot Postgres and cold Parquet."""

from trace_platform.query.service import Plan, QueryService, Result

__all__ = ["Plan", "QueryService", "Result"]
