"""What `sql_transform` lets through: one read query over the task's own input views.

User SQL is untrusted. Spark SQL is a program language (`SELECT TRANSFORM(x) USING 'sh …'` runs
a shell, `java_method`/`reflect` call any static Java method, ``text.`/path` `` reads a file,
`${env:X}` substitutes the JVM's environment, `ADD JAR`, `CREATE FUNCTION`, `SET` …), so the
statement is checked against an allowlist before Spark sees it:

1. `check_query` parses it with sqlglot's Spark dialect and walks the whole tree. Accepted: exactly
   one statement, a read query (SELECT, set operations, WITH … SELECT, VALUES), made only of the
   syntax listed in `SYNTAX` and of allowlisted functions: every function class sqlglot knows
   (minus `DENIED_CLASSES` and anything whose SQL name is in `DENIED_FUNCTIONS`) plus the Spark
   built-ins sqlglot parses as `Anonymous` that are listed in `SPARK_EXTRA_FUNCTIONS`. Every
   table reference must be an unqualified input view name or a CTE name in scope (a CTE's body
   sees only the CTEs before it, or itself when recursive; nothing outside its statement sees it;
   a subquery alias is never a table name). Table-valued functions and LATERAL VIEW take only the
   generators in `GENERATORS`. Hints: only Spark's plain join/partitioning hints, over names and
   literals. Anything else is refused with `SqlRefused` naming what was refused. The exact-amount
   helpers (`u256_sum(x)`, …: `trace_platform.spark.helpers`) are expanded into the built-ins
   they stand for before this check, so they are checked like hand-written SQL.
2. What runs is not the user's text but the SQL regenerated from the checked tree (comments
   dropped, `:name` / `?` parameter markers kept), and that text is parsed and checked again, so
   the check holds for exactly the text Spark gets.
3. `check_spark_plan` (`trace_platform.spark.sql_plan_check`) parses that text once more with
   Spark's own parser (no analysis, nothing runs) and refuses script transforms, qualified or unknown relations, non-builtin or denied
   functions: a second wall, in case sqlglot and Spark ever read the text differently.

The session itself is hardened too (`spark.sql.runSQLOnFiles=false`,
`spark.sql.variable.substitute=false`, see `trace_platform.spark`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, SqlglotError, UnsupportedError

from trace_platform.operators.context import PermanentError
from trace_platform.spark import helpers
from trace_platform.spark.dialect import DIALECT
from trace_platform.spark.sql_allowlist import (
    DENIED_CLASSES,
    DENIED_FUNCTIONS,
    FILE_FORMATS,
    GENERATORS,
    HINTS,
    QUERY_ROOTS,
    READ_QUERY,
    SIMPLE_NAME,
    SPARK_EXTRA_FUNCTIONS,
    SYNTAX,
)


class SqlRefused(PermanentError):
    """A statement `sql_transform` will not run; the message names what was refused."""


def refuse(what: str) -> SqlRefused:
    return SqlRefused(f"sql_transform refuses {what}")


@dataclass(frozen=True)
class CheckedQuery:
    """A query that passed the guard: `sql` is what Spark should run (regenerated from the
    checked tree), `tables` the input views it reads, `ctes` every CTE name it declares,
    `parameters` the named markers (`:name`) it uses."""

    sql: str
    tables: frozenset[str]
    ctes: frozenset[str]
    parameters: frozenset[str]


@dataclass
class _Found:
    inputs: dict[str, str]  # lower-case name -> declared name
    tables: set[str] = field(default_factory=set)
    ctes: set[str] = field(default_factory=set)
    parameters: set[str] = field(default_factory=set)


def check_query(sql: str, inputs: Iterable[str]) -> CheckedQuery:
    """Checks `sql` against the allowlist for a task whose input views are `inputs`; returns the
    text to run. Raises `SqlRefused` (a `PermanentError`) naming what was refused.

    An accepted query is remembered (the answer depends on the text and the views alone): an
    operator host runs a job's same SQL task after task, and the check of a query using the
    u256 helpers takes a CPU-second or so. A refusal is checked afresh each time."""
    return _check_query(sql, tuple(inputs))


@functools.lru_cache(maxsize=256)
def _check_query(sql: str, inputs: tuple[str, ...]) -> CheckedQuery:
    names = {n.lower(): n for n in inputs}
    if "${" in sql:  # Spark substitutes these anywhere, string literals included
        raise refuse("${…} variable substitution (it reads the environment and the config)")
    try:
        tree = _expand_helpers(_parse_one(sql))
        found = _check_tree(tree, names)
        try:
            text = tree.sql(dialect=DIALECT, comments=False, unsupported_level=ErrorLevel.RAISE)
        except UnsupportedError as e:
            raise refuse(f"the query: it has no exact Spark SQL form ({e})") from None
        if "${" in text:
            raise refuse("${…} variable substitution (it reads the environment and the config)")
        # Check the regenerated text itself: it is what runs.
        again = _check_tree(_parse_one(text), names)
    except RecursionError:
        raise refuse("the query: it is nested too deeply to check") from None
    if again.tables != found.tables or again.parameters != found.parameters:
        raise refuse("the query: it does not survive regeneration unchanged")
    return CheckedQuery(
        sql=text,
        tables=frozenset(found.tables),
        ctes=frozenset(found.ctes),
        parameters=frozenset(found.parameters),
    )


def _expand_helpers(tree: exp.Expression) -> exp.Expression:
    """The u256 helpers (`trace_platform.spark.helpers`) as the built-ins they stand for."""
    try:
        return helpers.expand(tree)
    except helpers.HelperMisused as e:
        raise refuse(f"the query: {e}") from None


def _parse_one(sql: str) -> exp.Expression:
    try:
        trees = [t for t in sqlglot.parse(sql, read=DIALECT) if t is not None]
    except SqlglotError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SqlRefused(f"sql_transform cannot parse the query: {first}") from None
    if not trees:
        raise SqlRefused("sql_transform needs one query; config.sql holds none")
    if len(trees) > 1:
        raise refuse(f"{len(trees)} statements: {READ_QUERY}")
    return trees[0]


def _statement_name(tree: exp.Expression) -> str:
    if isinstance(tree, exp.Command):
        return str(tree.this).upper()
    if isinstance(tree, exp.Create):
        kind = str(tree.args.get("kind") or "").upper()
        if kind == "FUNCTION":
            return "CREATE FUNCTION (it registers code)"
        return f"CREATE {kind}".strip()
    if isinstance(tree, (exp.Drop, exp.Alter)):
        return f"{type(tree).__name__.upper()} {str(tree.args.get('kind') or '').upper()}".strip()
    simple = {
        exp.Set: "SET",
        exp.Use: "USE",
        exp.Cache: "CACHE",
        exp.Uncache: "UNCACHE",
        exp.Refresh: "REFRESH",
        exp.Insert: "INSERT",
        exp.Merge: "MERGE",
        exp.Delete: "DELETE",
        exp.Update: "UPDATE",
        exp.LoadData: "LOAD DATA",
        exp.Describe: "DESCRIBE",
        exp.TruncateTable: "TRUNCATE",
        exp.Analyze: "ANALYZE",
        exp.Declare: "DECLARE",
    }
    for cls, name in simple.items():
        if isinstance(tree, cls):
            return name
    words = tree.sql(dialect=DIALECT).split()
    return words[0].upper() if words else type(tree).__name__.upper()


def _check_tree(tree: exp.Expression, inputs: dict[str, str]) -> _Found:
    if not isinstance(tree, QUERY_ROOTS):
        raise refuse(f"{_statement_name(tree)}: {READ_QUERY}")
    found = _Found(inputs=inputs)
    _check(tree, frozenset(), found)
    return found


def _children(node: exp.Expression, skip: str | None = None) -> Iterator[exp.Expression]:
    for key, value in node.args.items():
        if key == skip:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, exp.Expression):
                yield item


def _check(node: exp.Expression, ctes: frozenset[str], found: _Found) -> None:
    with_ = node.args.get("with_")
    if isinstance(with_, exp.With):
        ctes = _check_with(with_, ctes, found)
        for child in _children(node, skip="with_"):
            _check(child, ctes, found)
        return
    if isinstance(node, exp.With):  # a WITH somewhere else than on a query
        raise refuse("WITH outside a query")
    if isinstance(node, exp.Table):
        _check_table(node, ctes, found)
        return
    if isinstance(node, exp.Lateral):
        _check_lateral(node, ctes, found)
        return
    if isinstance(node, exp.Hint):
        _check_hint(node)
        return
    if isinstance(node, exp.QueryTransform):
        raise refuse("TRANSFORM … USING (runs a program)")
    if isinstance(node, (exp.Parameter, exp.SessionParameter)):
        raise refuse("${…} variable substitution (it reads the environment and the config)")
    if isinstance(node, exp.Placeholder):
        if node.this:
            found.parameters.add(str(node.this))
    elif isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
        raise refuse(f"the qualified function name '{node.sql(dialect=DIALECT)}'")
    elif isinstance(node, exp.Func):
        _check_function(node)
    elif not isinstance(node, SYNTAX):
        raise refuse(f"{_describe(node)} (not on the allowlist of read-query syntax)")
    for child in _children(node):
        _check(child, ctes, found)


def _describe(node: exp.Expression) -> str:
    text = node.sql(dialect=DIALECT)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(node).__name__} syntax ({text!r})"


def _check_with(with_: exp.With, ctes: frozenset[str], found: _Found) -> frozenset[str]:
    """CTE scoping: each body sees only the CTEs declared before it (plus itself when the WITH is
    recursive); the statement that owns the WITH sees them all; nothing outside it does."""
    recursive = bool(with_.args.get("recursive"))
    for cte in with_.expressions:
        if not isinstance(cte, exp.CTE):
            raise refuse(f"{_describe(cte)} in WITH")
        name = cte.alias_or_name
        if not SIMPLE_NAME.fullmatch(name):
            raise refuse(f"the CTE name {name!r} (use letters, digits and _)")
        key = name.lower()
        alias = cte.args.get("alias")
        if isinstance(alias, exp.TableAlias):
            for column in alias.columns:
                _check(column, ctes, found)
        body = cte.this
        if not isinstance(body, QUERY_ROOTS):
            raise refuse(f"{_statement_name(body)} inside WITH: {READ_QUERY}")
        _check(body, ctes | {key} if recursive else ctes, found)
        for key_, value in cte.args.items():  # e.g. MATERIALIZED: not Spark
            if key_ not in ("this", "alias") and value:
                raise refuse(f"CTE option {key_!r}")
        ctes = ctes | {key}
        found.ctes.add(key)
    return ctes


_TABLE_ARGS = frozenset({"this", "alias", "db", "catalog", "sample", "pivots", "joins", "laterals"})


def _check_table(node: exp.Table, ctes: frozenset[str], found: _Found) -> None:
    target = node.this
    if isinstance(target, exp.Func):  # FROM explode(…), FROM range(…)
        name = _function_name(target)
        if name not in GENERATORS:
            raise refuse(f"the table function '{name}' (only generators: {listed(GENERATORS)})")
        _check(target, ctes, found)
    else:
        db, catalog = node.args.get("db"), node.args.get("catalog")
        if db is not None or catalog is not None:
            qualified = node.sql(dialect=DIALECT).split(" ")[0]
            if db is not None and catalog is None and db.name.lower() in FILE_FORMATS:
                raise refuse(f"the file-path table {qualified} (it reads files)")
            raise refuse(
                f"the qualified table name {qualified}: only the job's inputs "
                f"({listed(found.inputs.values())}) and CTEs"
            )
        if not isinstance(target, exp.Identifier):
            raise refuse(f"{_describe(node)} as a table")
        key = target.name.lower()
        if key in ctes:
            pass
        elif key in found.inputs:
            found.tables.add(found.inputs[key])
        else:
            raise refuse(
                f"the query: table '{target.name}' is not an input of this job "
                f"(inputs: {listed(found.inputs.values())})"
            )
    for key, value in node.args.items():
        if key in ("this", "db", "catalog") or value in (None, False, [], ""):
            continue
        if key not in _TABLE_ARGS:
            raise refuse(f"the table clause {key.upper()} in {node.sql(dialect=DIALECT)!r}")
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, exp.Expression):
                _check(item, ctes, found)


def _check_lateral(node: exp.Lateral, ctes: frozenset[str], found: _Found) -> None:
    target = node.this
    if isinstance(target, exp.Func):
        name = _function_name(target)
        if name not in GENERATORS - {"range"}:
            raise refuse(f"LATERAL VIEW with '{name}' (only generators: {listed(GENERATORS)})")
    elif not isinstance(target, exp.Subquery):
        raise refuse(f"{_describe(node)}")
    if node.args.get("cross_apply") is not None:
        raise refuse("CROSS/OUTER APPLY")
    for child in _children(node):
        _check(child, ctes, found)


def _check_hint(node: exp.Hint) -> None:
    for hint in node.expressions:
        if isinstance(hint, exp.JoinHint):
            name = str(hint.this)
        elif isinstance(hint, exp.Anonymous):
            name = hint.name
        elif isinstance(hint, exp.Func):
            name = hint.sql_name()
        else:
            raise refuse(f"the hint {hint.sql(dialect=DIALECT)!r}")
        if name.lower() not in HINTS:
            raise refuse(f"the hint {name!r} (allowed: {listed(HINTS)})")
        for arg in _children(hint):
            plain_table = isinstance(arg, exp.Table) and isinstance(arg.this, exp.Identifier)
            if plain_table and not (arg.args.get("db") or arg.args.get("catalog")):
                continue
            if isinstance(arg, (exp.Literal, exp.Identifier)) or (
                isinstance(arg, exp.Column) and not arg.table
            ):
                continue
            raise refuse(f"the hint argument {arg.sql(dialect=DIALECT)!r} in {name}")


def _function_name(node: exp.Func) -> str:
    if isinstance(node, (exp.Anonymous, exp.AnonymousAggFunc)):
        return node.name.lower()
    return node.sql_name().lower()


def _check_function(node: exp.Func) -> None:
    if isinstance(node, (exp.Anonymous, exp.AnonymousAggFunc)):
        name = node.name.lower()
        check_name(name)
        if not isinstance(node.this, str) or not SIMPLE_NAME.fullmatch(name):
            raise refuse(f"the quoted or unusual function name {node.this!r}")
        if name not in SPARK_EXTRA_FUNCTIONS:
            raise refuse(
                f"the query: function '{name}' is not allowed (not a Spark built-in on the allowlist)"
            )
        return
    for name in [n.lower() for n in type(node).sql_names()] or [type(node).__name__.lower()]:
        check_name(name)
    if isinstance(node, DENIED_CLASSES):
        raise refuse(f"the query: function '{_function_name(node)}' is not allowed")


def check_name(name: str) -> None:
    """Refuses a function denied by name (both walls ask, whatever class sqlglot gives it)."""
    if name.startswith("java_") or name in DENIED_FUNCTIONS:
        why = DENIED_FUNCTIONS.get(name, "it calls Java methods")
        raise refuse(f"the query: function '{name}' is not allowed ({why})")


def listed(names: Iterable[str]) -> str:
    """`names` for a refusal's message: sorted, comma-separated."""
    return ", ".join(sorted(names)) or "none"
