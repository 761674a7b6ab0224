"""The house rules the code must keep (issue 13): the state store has one owner, and the
dispatcher holds no SQL. A module that breaks them fails here, named."""

from __future__ import annotations

import ast
import functools
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
# Who may import the AWS SDK: the AWS adapters, each behind its protocol (the sqs queue driver,
# the s3 object store, and whatever later adapters live under aws/). Nothing of the task
# lifecycle does, so the aws profile swaps adapters and never the code that uses them.
AWS_SDK_USERS = ("queue/sqs.py", "objectstore/s3.py", "aws/")
AWS_SDK = ("boto3", "botocore", "aiobotocore", "s3transfer")
# The Lambda entry handlers are outer shells, as the CLI is: they call the core, and nothing
# outside aws/ calls them (the core must run the same with or without them).
AWS_ENTRIES = (
    "trace_platform.aws.eventbridge",
    "trace_platform.aws.apigateway",
    "trace_platform.aws.container",
)
# A queue driver is chosen by queue.make_driver only: everyone else holds a QueueDriver.
QUEUE_DRIVERS = ("trace_platform.queue.pgqueue", "trace_platform.queue.sqs")
_STATEMENT = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|LOCK|CREATE)\b", re.IGNORECASE)


@functools.cache
def _modules() -> dict[str, ast.Module]:
    """Every module's path under the package -> its tree, parsed once for all the tests."""
    return {
        str(p.relative_to(SRC)): ast.parse(p.read_text())
        for p in sorted(SRC.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def test_only_the_store_loads_named_sql() -> None:
    offenders = []
    for name, tree in _modules().items():
        if name.startswith(SQL_OWNERS):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "trace_platform.db.queries":
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == [], f"named SQL loaded outside trace_platform/store: {offenders}"


def test_no_inline_sql_against_the_state_store() -> None:
    offenders = []
    for name, tree in _modules().items():
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
    for name, tree in _modules().items():
        if name not in lifecycle:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("psycopg"):
                offenders.append(f"{name}:{node.lineno} imports {node.module}")
    assert offenders == [], offenders


def _module_names() -> dict[str, Path]:
    """Dotted name of every trace_platform module -> its file (a package is its __init__)."""
    names: dict[str, Path] = {}
    for path in sorted(SRC.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = ["trace_platform", *path.relative_to(SRC).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _executed_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import that can run: at module level and inside functions alike (a deferred import
    is how a circle hides, not how it is broken); only `if TYPE_CHECKING:` blocks never run."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return found


def _import_graph() -> dict[str, set[str]]:
    """module -> the trace_platform modules it imports. `from pkg import sub` names the submodule
    `pkg.sub`; the implicit import of a parent package is not an edge (Python allows a child to
    load while its package is still initialising, as long as the child needs nothing from it)."""
    names = _module_names()

    def owner(dotted: str) -> str | None:
        while dotted and dotted not in names:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: list[str] = []
        for node in _executed_imports(_modules()[str(path.relative_to(SRC))]):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
                continue
            base = node.module or ""
            if node.level:  # relative: climb from this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets += [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base
                for alias in node.names
            ]
        graph[name] = {t for t in map(owner, targets) if t and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_sees_a_circle() -> None:
    """Guard the guard: a three-module circle and a self-contained chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    """No two trace_platform modules import each other, directly or round a circle (issue 39:
    config <-> spark.objects and spark.helpers <-> sql_guard <-> u256 were broken by moving the
    shared pieces to modules both can import; this keeps them from coming back)."""
    graph = _import_graph()
    assert "trace_platform.spark.sql_guard" in graph  # the graph really covers the package
    cycles = _cycles(graph)
    assert cycles == [], "import cycles:\n" + "\n".join(", ".join(c) for c in cycles)


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import names (absolute imports: the package uses no relative ones)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def test_only_the_aws_adapters_import_the_aws_sdk() -> None:
    offenders = []
    for name, tree in _modules().items():
        if name.startswith(AWS_SDK_USERS):
            continue
        for node in _executed_imports(tree):
            sdk = {m for m in _imported(node) if m.split(".")[0] in AWS_SDK}
            if sdk:
                offenders.append(f"{name}:{node.lineno} imports {sorted(sdk)[0]}")
    assert offenders == [], f"the AWS SDK imported outside the AWS adapters: {offenders}"


def test_nothing_outside_aws_imports_the_entry_handlers() -> None:
    offenders = []
    for name, tree in _modules().items():
        if name.startswith("aws/"):
            continue
        for node in _executed_imports(tree):
            if any(m == e or m.startswith(e + ".") for m in _imported(node) for e in AWS_ENTRIES):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == [], f"an AWS entry handler imported outside aws/: {offenders}"


def test_only_make_driver_picks_a_queue_driver() -> None:
    offenders = []
    for name, tree in _modules().items():
        if name.startswith("queue/"):  # make_driver, and the drivers and their own helpers
            continue
        for node in _executed_imports(tree):
            names = _imported(node)
            if any(
                m == d or m.startswith((d + "_", d + ".")) for m in names for d in QUEUE_DRIVERS
            ):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == [], f"a queue driver imported past queue.make_driver: {offenders}"


def test_the_import_guards_see_an_import() -> None:
    """Guard the guards: a function-level boto3 import and a driver import are found."""
    tree = ast.parse("def f():\n    import botocore.config\nfrom trace_platform.queue import sqs\n")
    found = [m for node in _executed_imports(tree) for m in _imported(node)]
    assert "botocore.config" in found and "trace_platform.queue.sqs" in found
