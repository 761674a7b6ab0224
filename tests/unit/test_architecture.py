"""The house rules the code must keep (issue 13): the state store has one owner, and the
dispatcher holds no SQL. A module that breaks them fails here, named."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import trace_platform

SRC = Path(trace_platform.__file__).parent
# Who may load named SQL: the state store's owner, the Postgres queue adapter (the owner of its
# own tables) and the database's own tooling.
SQL_OWNERS = ("store/", "queue/pgqueue.py", "db/")
# Inline SQL text is allowed only where it is not the state store: DuckDB in the Query Service,
# the hot-window sink's data DSN, and the database's own tooling.
INLINE_SQL_ALLOWED = ("store/", "db/", "query/", "operators/hot_window.py")
_STATEMENT = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|LOCK|CREATE)\b", re.IGNORECASE)


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (str(p.relative_to(SRC)), ast.parse(p.read_text()))
        for p in sorted(SRC.rglob("*.py"))
        if "__pycache__" not in p.parts
    ]


def test_only_the_store_loads_named_sql() -> None:
    offenders = []
    for name, tree in _modules():
        if name.startswith(SQL_OWNERS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "trace_platform.db.queries":
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == [], f"named SQL loaded outside trace_platform/store: {offenders}"


def test_no_inline_sql_against_the_state_store() -> None:
    offenders = []
    for name, tree in _modules():
        if name.startswith(INLINE_SQL_ALLOWED):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("execute", "executemany")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and _STATEMENT.match(node.args[0].value)
            ):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == [], f"inline SQL outside the store: {offenders}"


def test_the_dispatcher_holds_no_connection_or_sql() -> None:
    """The lifecycle talks to `StateStore` only (so the in-memory twin can run it)."""
    lifecycle = {
        "dispatcher/lifecycle.py",
        "dispatcher/intents.py",
        "dispatcher/slots.py",
        "dispatcher/fencing.py",
        "dispatcher/state.py",
        "dispatcher/access.py",
        "dispatcher/commits.py",
        "dispatcher/reads.py",
    }
    offenders = []
    for name, tree in _modules():
        if name not in lifecycle:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("psycopg"):
                offenders.append(f"{name}:{node.lineno} imports {node.module}")
    assert offenders == [], offenders
