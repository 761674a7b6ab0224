"""Compatibility: the error hierarchy lives in `trace_platform.errors` (base `TraceError`)."""

from trace_platform.errors import (
    Conflict,
    DispatcherError,
    Forbidden,
    Invalid,
    NotFound,
    TraceError,
    Unauthorized,
)

__all__ = [
    "Conflict",
    "DispatcherError",
    "Forbidden",
    "Invalid",
    "NotFound",
    "TraceError",
    "Unauthorized",
]
