"""Operators: named units of work the worker runs in its operator host process.

The registry maps a name to "module:function" so a host imports only what it runs (Spark
operators are heavy). An operator is `fn(ctx: OperatorContext) -> list[EventIn] | None`; what it
returns are its final events, reported atomically with the completion.

Each operator also declares a pydantic model of its config (`CONFIGS`, "module:Class", a
`trace_platform.operators.config.OperatorConfig`): deploy and `trace dag validate` check a
job's config with it, and the operator reads its config through it when it runs.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from trace_platform.operators.config import OperatorConfig
from trace_platform.operators.context import (
    OperatorContext,
    OperatorError,
    OperatorResult,
    PermanentError,
)

__all__ = [
    "CLUSTER_OPERATORS",
    "REGISTRY",
    "TRUSTED_OPERATORS",
    "WHOLE_INPUT_OPERATORS",
    "WHOLE_OUTPUT_OPERATORS",
    "OperatorContext",
    "OperatorError",
    "OperatorResult",
    "PermanentError",
    "config_model",
    "registry",
    "resolve",
]

Operator = Callable[[OperatorContext], Any]

REGISTRY: dict[str, str] = {
    "sleep": "trace_platform.operators.builtin:sleep",
    "range_splitter": "trace_platform.operators.ranges:range_splitter",
    "chain_tip": "trace_platform.operators.ranges:chain_tip",
    "range_aggregator": "trace_platform.operators.ranges:range_aggregator",
    "cryo_ingest": "trace_platform.operators.cryo_ingest:cryo_ingest",
    "decode_erc20_transfers": "trace_platform.operators.decode:decode_erc20_transfers",
    "decode_staking_events": "trace_platform.operators.decode:decode_staking_events",
    "sql_transform": "trace_platform.operators.sql_transform:sql_transform",
    "hot_window": "trace_platform.operators.hot_window:hot_window",
    "alert_evaluate": "trace_platform.operators.alert_evaluate:alert_evaluate",
    "alert_route": "trace_platform.operators.alert_route:alert_route",
}

# Only with TRACE_OPERATOR_REGISTRY=testing (refused by the aws profile).
TESTING: dict[str, str] = {
    name: f"trace_platform.operators.testing:{name}"
    for name in (
        "noop",
        "fail",
        "crash",
        "emit_events",
        "probe",
        "spark_ping",
        "leave_traces",
        "publish_rows",
    )
}

CONFIGS: dict[str, str] = {
    "sleep": "trace_platform.operators.builtin:SleepConfig",
    "range_splitter": "trace_platform.operators.ranges:RangeSplitterConfig",
    "chain_tip": "trace_platform.operators.ranges:ChainTipConfig",
    "range_aggregator": "trace_platform.operators.ranges:RangeAggregatorConfig",
    "cryo_ingest": "trace_platform.operators.cryo_ingest:CryoIngestConfig",
    "decode_erc20_transfers": "trace_platform.operators.decode:Erc20TransfersConfig",
    "decode_staking_events": "trace_platform.operators.decode:StakingEventsConfig",
    "sql_transform": "trace_platform.operators.sql_transform:SqlTransformConfig",
    "hot_window": "trace_platform.operators.hot_window:HotWindowConfig",
    "alert_evaluate": "trace_platform.operators.alert_evaluate:AlertEvaluateConfig",
    "alert_route": "trace_platform.operators.alert_route:AlertRouteConfig",
    **{
        name: f"trace_platform.operators.testing:{model}"
        for name, model in (
            ("noop", "NoopConfig"),
            ("fail", "FailConfig"),
            ("crash", "NoConfig"),
            ("emit_events", "EmitEventsConfig"),
            ("probe", "ProbeConfig"),
            ("spark_ping", "NoConfig"),
            ("leave_traces", "LeaveTracesConfig"),
            ("publish_rows", "PublishRowsConfig"),
        )
    },
}

# Operators that read every committed scope of every input (the rest read only the scope of the
# event that started them): the Dispatcher sends each its committed locations accordingly.
WHOLE_INPUT_OPERATORS = frozenset({"sql_transform", "alert_evaluate"})

# Operators that rewrite their output whole, as one scope (`all`), from what they read; the
# scope's last commit wins, so two runs at once could land the older read last. The Dispatcher
# runs a job of one only one run at a time (see trace_platform.dag.whole).
WHOLE_OUTPUT_OPERATORS = frozenset({"sql_transform"})

# Platform sinks that write Postgres data: only these get a data DSN, and only on ecs_platform.
TRUSTED_OPERATORS = frozenset({"hot_window", "alert_route"})

# Operators whose Spark work may run on a Spark Connect cluster (TRACE_SPARK_MASTER=sc://):
# platform code whose only user input is validated config and guarded SQL, since the cluster's
# executors hold the store credentials. Any other operator's Spark stays in the sandbox.
CLUSTER_OPERATORS = frozenset({"decode_erc20_transfers", "decode_staking_events", "sql_transform"})


class UnknownOperator(LookupError):
    pass


def registry() -> dict[str, str]:
    """The operators this process may run: the platform's, plus the test operators only when
    TRACE_OPERATOR_REGISTRY=testing outside the aws profile."""
    if os.environ.get("TRACE_OPERATOR_REGISTRY", "production") != "testing":
        return REGISTRY
    if os.environ.get("TRACE_PROFILE") == "aws":
        raise RuntimeError("the aws profile cannot load the test operators")
    return {**REGISTRY, **TESTING}


def resolve(name: str) -> Operator:
    known_ops = registry()
    target = known_ops.get(name)
    if target is None:
        known = ", ".join(sorted(known_ops))
        raise UnknownOperator(f"unknown operator '{name}' (known: {known})")
    module, _, attr = target.partition(":")
    fn: Operator = getattr(importlib.import_module(module), attr)
    return fn


def config_model(name: str) -> type[OperatorConfig] | None:
    """The config model of an operator this process may run (None for an unknown one)."""
    if name not in registry():
        return None
    target = CONFIGS.get(name)
    if target is None:
        return None
    module, _, attr = target.partition(":")
    model: type[OperatorConfig] = getattr(importlib.import_module(module), attr)
    return model
