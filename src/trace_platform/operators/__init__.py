"""Operators: named units of work the worker runs in its operator host process.

The registry maps a name to "module:function" so a host imports only what it runs (Spark
operators are heavy). An operator is `fn(ctx: OperatorContext) -> list[EventIn] | None`; what it
returns are its final events, reported atomically with the completion.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from trace_platform.operators.context import (
    OperatorContext,
    OperatorError,
    OperatorResult,
    PermanentError,
)

__all__ = [
    "REGISTRY",
    "TRUSTED_OPERATORS",
    "OperatorContext",
    "OperatorError",
    "OperatorResult",
    "PermanentError",
    "resolve",
]

Operator = Callable[[OperatorContext], Any]

REGISTRY: dict[str, str] = {
    "noop": "trace_platform.operators.builtin:noop",
    "sleep": "trace_platform.operators.builtin:sleep",
    "fail": "trace_platform.operators.builtin:fail",
    "emit_events": "trace_platform.operators.builtin:emit_events",
    "crash": "trace_platform.operators.builtin:crash",
    "range_splitter": "trace_platform.operators.ranges:range_splitter",
    "chain_tip": "trace_platform.operators.ranges:chain_tip",
    "range_aggregator": "trace_platform.operators.ranges:range_aggregator",
    "cryo_ingest": "trace_platform.operators.cryo_ingest:cryo_ingest",
    "decode_erc20_transfers": "trace_platform.operators.decode:decode_erc20_transfers",
    "decode_staking_events": "trace_platform.operators.decode:decode_staking_events",
    "sql_transform": "trace_platform.operators.sql_transform:sql_transform",
    "hot_window": "trace_platform.operators.hot_window:hot_window",
}

# Platform sinks that write Postgres data: only these get a data DSN, and only on ecs_platform.
TRUSTED_OPERATORS = frozenset({"hot_window"})


class UnknownOperator(LookupError):
    pass


def resolve(name: str) -> Operator:
    target = REGISTRY.get(name)
    if target is None:
        known = ", ".join(sorted(REGISTRY))
        raise UnknownOperator(f"unknown operator '{name}' (known: {known})")
    module, _, attr = target.partition(":")
    fn: Operator = getattr(importlib.import_module(module), attr)
    return fn
