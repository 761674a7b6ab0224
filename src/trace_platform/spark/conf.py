"""The Spark settings every session carries (`SESSION_HARDENING`) and the ones a user may add
(TRACE_SPARK_CONF). Stdlib only, so `trace_platform.config` can validate TRACE_SPARK_CONF at
load without importing the Spark runtime (which reads the config back)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

# Set on the SparkConf (so every session and RESET keep them) and again on each task session.
SESSION_HARDENING: dict[str, str] = {
    "spark.sql.runSQLOnFiles": "false",
    "spark.sql.variable.substitute": "false",
    # Exact amounts rely on it: an overflowing limb sum or a bad cast is an error, never a
    # wrapped or NULL number (a spark-defaults.conf must not turn it off).
    "spark.sql.ansi.enabled": "true",
}


def check_user_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """A user's Spark settings (TRACE_SPARK_CONF): `spark.*` keys only, and none that would
    undo `SESSION_HARDENING` or choose the master (TRACE_SPARK_MASTER does)."""
    out: dict[str, str] = {}
    for key, value in conf.items():
        if not key.startswith("spark."):
            raise ValueError(f"TRACE_SPARK_CONF: {key!r} is not a Spark setting (spark.*)")
        if key == "spark.master" or key.startswith("spark.remote"):
            raise ValueError(f"TRACE_SPARK_CONF: set {key} through TRACE_SPARK_MASTER")
        if key in SESSION_HARDENING and str(value) != SESSION_HARDENING[key]:
            raise ValueError(
                f"TRACE_SPARK_CONF: {key} is fixed at {SESSION_HARDENING[key]} (operators' "
                "sessions are hardened)"
            )
        out[key] = str(value)
    return out


def user_conf(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The user's Spark settings as the worker handed them to this host (TRACE_SPARK_CONF)."""
    raw = (os.environ if environ is None else environ).get("TRACE_SPARK_CONF") or "{}"
    return check_user_conf(json.loads(raw))
