"""The second wall of `sql_transform`'s guard (step 3 in `trace_platform.spark.sql_guard`): the
text the sqlglot check accepted is parsed once more by Spark's own parser (no analysis, nothing
runs), in case sqlglot and Spark ever read the same text differently."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

from trace_platform.spark import get_spark, spark_error_text
from trace_platform.spark.sql_allowlist import GENERATORS, SIMPLE_NAME
from trace_platform.spark.sql_guard import CheckedQuery, SqlRefused, check_name, listed, refuse

_builtin_lock = threading.Lock()
_builtin_functions: frozenset[str] | None = None

_PLAN_DENIED = ("ScriptTransformation", "UnresolvedIdentifier", "Command", "InsertInto")


def _spark_builtins(spark: Any) -> frozenset[str]:
    global _builtin_functions
    with _builtin_lock:
        if _builtin_functions is None:
            rows = spark.sql("SHOW SYSTEM FUNCTIONS").collect()
            _builtin_functions = frozenset(str(r[0]).lower() for r in rows)
        return _builtin_functions


def _plan_nodes(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        if "class" in value:
            yield value
        for item in value.values():
            yield from _plan_nodes(item)
    elif isinstance(value, list):
        for item in value:
            yield from _plan_nodes(item)


def _one_name(parts: Any) -> str | None:
    """`[name]` (Scala's Seq rendering) -> name, for a single simple name; else None."""
    text = str(parts)
    if text.startswith("[") and text.endswith("]") and SIMPLE_NAME.fullmatch(text[1:-1]):
        return text[1:-1]
    return None


def plan_parser(session: Any) -> Any:
    """The session whose JVM parses a query for `check_spark_plan`: the task's own, or, for a
    Spark Connect session (which exposes no parser), the host's local JVM (the same Spark)."""
    if type(session).__module__.startswith("pyspark.sql.connect"):
        return get_spark()
    return session


def check_spark_plan(spark: Any, checked: CheckedQuery) -> None:
    """Parses `checked.sql` with the session's own Spark parser (no analysis, nothing runs) and
    refuses what the sqlglot check should already have refused: script transforms, relations
    other than the inputs and CTEs, qualified, non-builtin or denied functions."""
    try:
        plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(checked.sql)
        tree = json.loads(plan.toJSON())
    except Exception as e:
        raise SqlRefused(f"sql_transform cannot parse the query: {spark_error_text(e)}") from None
    builtins = _spark_builtins(spark)
    allowed_tables = {t.lower() for t in checked.tables} | set(checked.ctes)
    for node in _plan_nodes(tree):
        cls = str(node["class"]).rsplit(".", 1)[-1]
        if cls == "ScriptTransformation":
            raise refuse("TRANSFORM … USING (runs a program)")
        if any(word in cls for word in _PLAN_DENIED):
            raise refuse(f"the query: Spark reads it as {cls}")
        if cls == "UnresolvedRelation":
            name = _one_name(node.get("multipartIdentifier"))
            if name is None or name.lower() not in allowed_tables:
                raise refuse(
                    f"the query: table {node.get('multipartIdentifier')} is not an input of this "
                    f"job (inputs: {listed(checked.tables)})"
                )
        elif cls == "UnresolvedTableValuedFunction":
            name = _one_name(node.get("name"))
            if name is None or name.lower() not in GENERATORS:
                raise refuse(f"the table function {node.get('name')}")
        elif cls == "UnresolvedFunction":
            name = _one_name(node.get("nameParts"))
            if name is None:
                raise refuse(f"the qualified function name {node.get('nameParts')}")
            check_name(name.lower())
            if name.lower() not in builtins:
                raise refuse(f"the query: function '{name}' is not a Spark built-in")
