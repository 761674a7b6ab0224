"""One long-lived SparkSession per operator host process (start-up costs seconds here).

`spark.master` comes from TRACE_SPARK_MASTER (default `local[*]`): a standalone, YARN or
Kubernetes master works by configuration alone. The JVM inherits the host's stdout/stderr,
which point at the worker's log file, so Spark's logs never reach the terminal.
"""

from __future__ import annotations

import os
import threading
from typing import Any

_lock = threading.Lock()
_session: Any = None


def get_spark() -> Any:
    global _session
    with _lock:
        if _session is None:
            from pyspark.sql import SparkSession

            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            builder = (
                SparkSession.builder.master(os.environ.get("TRACE_SPARK_MASTER", "local[*]"))
                .appName("trace-operator-host")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.session.timeZone", "UTC")
                .config(
                    "spark.sql.shuffle.partitions",
                    os.environ.get("TRACE_SPARK_SHUFFLE_PARTITIONS", "4"),
                )
                .config("spark.driver.memory", os.environ.get("TRACE_SPARK_DRIVER_MEMORY", "2g"))
            )
            _session = builder.getOrCreate()
            _session.sparkContext.setLogLevel("WARN")
        return _session


def drop_temp_views() -> None:
    """Temp views live as long as the session, which outlives tasks: the host drops them after
    each task so no task reads another's. A no-op in a host that never started Spark."""
    with _lock:
        session = _session
    if session is None:
        return
    for table in session.catalog.listTables():
        if table.isTemporary:
            session.catalog.dropTempView(table.name)


def spark_error_text(exc: BaseException, lines: int = 3) -> str:
    """The first useful lines of a Spark/JVM error (not the whole Java stack)."""
    text = str(exc).strip().splitlines()
    useful = [
        ln
        for ln in text
        if ln.strip() and not ln.lstrip().startswith(("at ", "...", "JVM stacktrace"))
    ]
    return "\n".join(useful[:lines]) or type(exc).__name__
