"""What `sql_transform` lets through: one read query over the task's own input views.

User SQL is untrusted. Spark SQL is a program language (`SELECT TRANSFORM(x) USING 'sh …'` runs
a shell, `java_method`/`reflect` call any static Java method, ``text.`/path` `` reads a file,
`${env:X}` substitutes the JVM's environment, `ADD JAR`, `CREATE FUNCTION`, `SET` …), so the
statement is checked against an allowlist before Spark sees it:

1. `check_query` parses it with sqlglot's Spark dialect and walks the whole tree. Accepted: exactly
   one statement, a read query (SELECT, set operations, WITH … SELECT, VALUES), made only of the
   syntax listed in `_SYNTAX` and of allowlisted functions: every function class sqlglot knows
   (minus `_DENIED_CLASSES` and anything whose SQL name is in `DENIED_FUNCTIONS`) plus the Spark
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
3. `check_spark_plan` parses that text once more with Spark's own parser (no analysis, nothing
   runs) and refuses script transforms, qualified or unknown relations, non-builtin or denied
   functions: a second wall, in case sqlglot and Spark ever read the text differently.

The session itself is hardened too (`spark.sql.runSQLOnFiles=false`,
`spark.sql.variable.substitute=false`, see `trace_platform.spark`).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import ErrorLevel, SqlglotError, UnsupportedError

from trace_platform.operators.context import PermanentError


class TraceSpark(Spark):
    """sqlglot's Spark dialect, lexing strings as Spark 4 does: `'it''s'` is one literal (`it's`),
    not two adjacent ones, so the regenerated text means what the user wrote."""

    class Tokenizer(Spark.Tokenizer):
        STRING_ESCAPES = ["\\", "'", '"']  # a quote doubled inside its own quotes


DIALECT = TraceSpark


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Functions refused by name (lower case), whatever class sqlglot gives them, with the reason.
DENIED_FUNCTIONS: dict[str, str] = {
    "java_method": "it calls Java methods",
    "reflect": "it calls Java methods",
    "try_reflect": "it calls Java methods",
    "input_file_name": "it reveals file paths",
    "input_file_block_start": "it reveals file paths",
    "input_file_block_length": "it reveals file paths",
    "current_user": "it reads the session context",
    "user": "it reads the session context",
    "session_user": "it reads the session context",
    "current_catalog": "it reads the session context",
    "current_database": "it reads the session context",
    "current_schema": "it reads the session context",
    "current_path": "it reads the session context",
    "version": "it reads the session context",
    "python_worker_logs": "it reads the session context",
    "collations": "it reads the session context",
    "sql_keywords": "it reads the session context",
    "from_avro": "it needs schema files",
    "to_avro": "it needs schema files",
    "schema_of_avro": "it needs schema files",
    "from_protobuf": "it reads descriptor files",
    "to_protobuf": "it reads descriptor files",
    "from_xml": "it runs an XML parser",
    "to_xml": "it runs an XML parser",
    "schema_of_xml": "it runs an XML parser",
    "xpath": "it runs an XML parser",
    "xpath_boolean": "it runs an XML parser",
    "xpath_double": "it runs an XML parser",
    "xpath_float": "it runs an XML parser",
    "xpath_int": "it runs an XML parser",
    "xpath_long": "it runs an XML parser",
    "xpath_number": "it runs an XML parser",
    "xpath_short": "it runs an XML parser",
    "xpath_string": "it runs an XML parser",
    "measure": "it reads metric views",
}

# Spark built-ins (4.x) that sqlglot parses as `Anonymous`: value-only scalar, aggregate, window
# and generator functions. Derived from `SHOW SYSTEM FUNCTIONS` minus what sqlglot knows, minus
# DENIED_FUNCTIONS. A Spark built-in missing here is refused until someone adds it.
SPARK_EXTRA_FUNCTIONS: frozenset[str] = _names(
    """
    aes_decrypt aes_encrypt array_repeat array_union arrays_overlap assert_true bigint bin binary
    bitmap_and_agg bround btrim cardinality collect_union conv count_min_sketch counter_diff crc32
    date_part datepart decimal e every expm1 find_in_set forall format_number from_csv get hash
    histogram_numeric hll_sketch_agg hll_sketch_estimate hll_union hll_union_agg hmac hypot
    inline_outer is_valid_utf8 is_valid_variant is_variant_null isnotnull isnull
    jaro_winkler_similarity json_array_length json_tuple kll_merge_agg_bigint kll_merge_agg_double
    kll_merge_agg_float kll_sketch_agg_bigint kll_sketch_agg_double kll_sketch_agg_float
    kll_sketch_get_n_bigint kll_sketch_get_n_double kll_sketch_get_n_float
    kll_sketch_get_quantile_bigint kll_sketch_get_quantile_double kll_sketch_get_quantile_float
    kll_sketch_get_rank_bigint kll_sketch_get_rank_double kll_sketch_get_rank_float
    kll_sketch_merge_bigint kll_sketch_merge_double kll_sketch_merge_float
    kll_sketch_to_string_bigint kll_sketch_to_string_double kll_sketch_to_string_float log1p
    luhn_check make_date make_dt_interval make_time make_timestamp_ltz make_timestamp_ntz
    make_valid_utf8 make_ym_interval map_concat map_entries map_filter map_values map_zip_with
    mask mean monotonically_increasing_id now nullifzero octet_length pmod positive printf quote
    raise_error range regexp schema_of_csv schema_of_json schema_of_variant schema_of_variant_agg
    sentences session_window shiftrightunsigned smallint some spark_partition_id st_asbinary
    st_geogfromwkb st_geomfromwkb st_setsrid st_srid std theta_difference theta_intersection
    theta_intersection_agg theta_sketch_agg theta_sketch_estimate theta_union theta_union_agg
    time_bucket time_from_micros time_from_millis time_from_seconds time_to_micros time_to_millis
    time_to_seconds timestamp_micros timestamp_millis timestamp_nanos timestamp_seconds tinyint
    to_csv to_time to_timestamp_ltz to_timestamp_ntz to_varchar to_variant_object transform_keys
    transform_values try_aes_decrypt try_avg try_make_interval try_make_timestamp
    try_make_timestamp_ltz try_make_timestamp_ntz try_mod try_parse_json try_parse_url try_sum
    try_to_binary try_to_date try_to_number try_to_time try_to_timestamp try_url_decode
    try_validate_utf8 try_variant_array_append try_variant_get try_variant_insert try_variant_set
    tuple_difference_double tuple_difference_integer tuple_difference_theta_double
    tuple_difference_theta_integer tuple_intersection_agg_double tuple_intersection_agg_integer
    tuple_intersection_double tuple_intersection_integer tuple_intersection_theta_double
    tuple_intersection_theta_integer tuple_sketch_agg_double tuple_sketch_agg_integer
    tuple_sketch_estimate_double tuple_sketch_estimate_integer tuple_sketch_summary_double
    tuple_sketch_summary_integer tuple_sketch_theta_double tuple_sketch_theta_integer
    tuple_union_agg_double tuple_union_agg_integer tuple_union_double tuple_union_integer
    tuple_union_theta_double tuple_union_theta_integer unix_nanos url_decode url_encode
    validate_utf8 variant_array_append variant_delete variant_explode variant_explode_outer
    variant_get variant_insert variant_set variant_strip_nulls vector_avg
    vector_cosine_similarity vector_inner_product vector_l2_distance vector_norm vector_normalize
    vector_sum weekday window window_time xxhash64 zeroifnull zip_with
    """
)

# Generators: the only functions allowed as a table (FROM f(…)) or in LATERAL VIEW.
GENERATORS: frozenset[str] = _names(
    """
    explode explode_outer posexplode posexplode_outer inline inline_outer stack json_tuple
    variant_explode variant_explode_outer range
    """
)

# Spark's plain hints: about join strategy and partitioning, over names and literals only.
HINTS: frozenset[str] = _names(
    """
    broadcast broadcastjoin mapjoin merge shuffle_merge mergejoin shuffle_hash
    shuffle_replicate_nl coalesce repartition repartition_by_range rebalance
    """
)

# sqlglot function classes that never belong in a Spark read query: other engines' I/O, ML,
# sequences and session context, and the generic carriers of unknown names (checked by name).
_DENIED_CLASSES: tuple[type[exp.Expression], ...] = (
    *(
        c
        for c in exp.ALL_FUNCTIONS
        if c.__name__.startswith(("AI", "ML", "XML", "Seq", "Current", "Read", "Generate"))
        and c not in (exp.CurrentDate, exp.CurrentTimestamp, exp.CurrentTime, exp.CurrentTimezone)
        and c.__name__ != "GenerateSeries"  # Spark's sequence()
    ),
    exp.CombinedAggFunc,
    exp.CombinedParameterizedAgg,
    exp.ParameterizedAgg,
    exp.Predict,
    exp.VectorSearch,
    exp.FeaturesAtTime,
    exp.Secret,
    exp.ToFile,
    exp.CheckXml,
    exp.JSONTable,
    exp.OpenJSON,
    exp.SessionUser,
    exp.NextValueFor,
    exp.DynamicIdentifier,
    exp.MatchAgainst,
    exp.Search,
    exp.SearchIp,
    exp.GapFill,
    exp.Columns,
    exp.StarMap,
    exp.Generator,
    exp.SplitToTable,
    exp.StrtokSplitToTable,
    exp.NetFunc,
    exp.ConnectByRoot,
)

# Syntax nodes (not functions) a read query may contain. Everything else is refused.
_SYNTAX: tuple[type[exp.Expression], ...] = (
    # query structure
    exp.Select,
    exp.Union,
    exp.Except,
    exp.Intersect,
    exp.Values,
    exp.Subquery,
    exp.TableAlias,
    exp.From,
    exp.Join,
    exp.Where,
    exp.Group,
    exp.Having,
    exp.Order,
    exp.Ordered,
    exp.Limit,
    exp.Offset,
    exp.Qualify,
    exp.Window,
    exp.WindowSpec,
    exp.Distinct,
    exp.Cluster,
    exp.Distribute,
    exp.Sort,
    exp.Cube,
    exp.Rollup,
    exp.GroupingSets,
    exp.TableSample,
    exp.Pivot,
    exp.Filter,
    exp.IgnoreNulls,
    exp.RespectNulls,
    exp.WithinGroup,
    # values and references
    exp.Star,
    exp.Column,
    exp.Identifier,
    exp.Alias,
    exp.Aliases,
    exp.Literal,
    exp.Boolean,
    exp.Null,
    exp.HexString,
    exp.ByteString,
    exp.RawString,
    exp.National,
    exp.Placeholder,
    exp.Var,
    exp.DataType,
    exp.DataTypeParam,
    exp.Interval,
    exp.IntervalSpan,
    exp.Paren,
    exp.Tuple,
    exp.Bracket,
    exp.Dot,
    exp.Lambda,
    exp.Kwarg,
    exp.PropertyEQ,
    exp.JSONPath,
    exp.JSONPathKey,
    exp.JSONPathRoot,
    exp.JSONPathSubscript,
    exp.JSONPathWildcard,
    exp.AtTimeZone,
    # predicates and operators
    exp.Between,
    exp.In,
    exp.Is,
    exp.Like,
    exp.ILike,
    exp.Escape,
    exp.Any,
    exp.All,
    exp.Not,
    exp.Neg,
    exp.BitwiseNot,
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Div,
    exp.IntDiv,
    exp.Mod,
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.NullSafeEQ,
    exp.NullSafeNEQ,
    exp.And,
    exp.Or,
    exp.Xor,
    exp.BitwiseAnd,
    exp.BitwiseOr,
    exp.BitwiseXor,
    exp.BitwiseLeftShift,
    exp.BitwiseRightShift,
    exp.DPipe,
)

_QUERY_ROOTS = (exp.Select, exp.SetOperation, exp.Values, exp.Subquery)

# Names Spark knows as data source formats: `fmt.\`path\`` reads that file.
_FILE_FORMATS = _names(
    "parquet text csv json orc avro binaryfile delta jdbc libsvm image xml hive noop"
)

_SIMPLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_READ_QUERY = "it accepts one read query (SELECT, WITH … SELECT, a set operation or VALUES)"


class SqlRefused(PermanentError):
    """A statement `sql_transform` will not run; the message names what was refused."""


def _refuse(what: str) -> SqlRefused:
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
    text to run. Raises `SqlRefused` (a `PermanentError`) naming what was refused."""
    names = {n.lower(): n for n in inputs}
    if "${" in sql:  # Spark substitutes these anywhere, string literals included
        raise _refuse("${…} variable substitution (it reads the environment and the config)")
    try:
        tree = _expand_helpers(_parse_one(sql))
        found = _check_tree(tree, names)
        try:
            text = tree.sql(dialect=DIALECT, comments=False, unsupported_level=ErrorLevel.RAISE)
        except UnsupportedError as e:
            raise _refuse(f"the query: it has no exact Spark SQL form ({e})") from None
        if "${" in text:
            raise _refuse("${…} variable substitution (it reads the environment and the config)")
        # Check the regenerated text itself: it is what runs.
        again = _check_tree(_parse_one(text), names)
    except RecursionError:
        raise _refuse("the query: it is nested too deeply to check") from None
    if again.tables != found.tables or again.parameters != found.parameters:
        raise _refuse("the query: it does not survive regeneration unchanged")
    return CheckedQuery(
        sql=text,
        tables=frozenset(found.tables),
        ctes=frozenset(found.ctes),
        parameters=frozenset(found.parameters),
    )


def _expand_helpers(tree: exp.Expression) -> exp.Expression:
    """The u256 helpers (`trace_platform.spark.helpers`) as the built-ins they stand for."""
    from trace_platform.spark import helpers

    try:
        return helpers.expand(tree)
    except helpers.HelperMisused as e:
        raise _refuse(f"the query: {e}") from None


def _parse_one(sql: str) -> exp.Expression:
    try:
        trees = [t for t in sqlglot.parse(sql, read=DIALECT) if t is not None]
    except SqlglotError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SqlRefused(f"sql_transform cannot parse the query: {first}") from None
    if not trees:
        raise SqlRefused("sql_transform needs one query; config.sql holds none")
    if len(trees) > 1:
        raise _refuse(f"{len(trees)} statements: {_READ_QUERY}")
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
    if not isinstance(tree, _QUERY_ROOTS):
        raise _refuse(f"{_statement_name(tree)}: {_READ_QUERY}")
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
        raise _refuse("WITH outside a query")
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
        raise _refuse("TRANSFORM … USING (runs a program)")
    if isinstance(node, (exp.Parameter, exp.SessionParameter)):
        raise _refuse("${…} variable substitution (it reads the environment and the config)")
    if isinstance(node, exp.Placeholder):
        if node.this:
            found.parameters.add(str(node.this))
    elif isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
        raise _refuse(f"the qualified function name '{node.sql(dialect=DIALECT)}'")
    elif isinstance(node, exp.Func):
        _check_function(node)
    elif not isinstance(node, _SYNTAX):
        raise _refuse(f"{_describe(node)} (not on the allowlist of read-query syntax)")
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
            raise _refuse(f"{_describe(cte)} in WITH")
        name = cte.alias_or_name
        if not _SIMPLE_NAME.fullmatch(name):
            raise _refuse(f"the CTE name {name!r} (use letters, digits and _)")
        key = name.lower()
        alias = cte.args.get("alias")
        if isinstance(alias, exp.TableAlias):
            for column in alias.columns:
                _check(column, ctes, found)
        body = cte.this
        if not isinstance(body, _QUERY_ROOTS):
            raise _refuse(f"{_statement_name(body)} inside WITH: {_READ_QUERY}")
        _check(body, ctes | {key} if recursive else ctes, found)
        for key_, value in cte.args.items():  # e.g. MATERIALIZED: not Spark
            if key_ not in ("this", "alias") and value:
                raise _refuse(f"CTE option {key_!r}")
        ctes = ctes | {key}
        found.ctes.add(key)
    return ctes


_TABLE_ARGS = frozenset({"this", "alias", "db", "catalog", "sample", "pivots", "joins", "laterals"})


def _check_table(node: exp.Table, ctes: frozenset[str], found: _Found) -> None:
    target = node.this
    if isinstance(target, exp.Func):  # FROM explode(…), FROM range(…)
        name = _function_name(target)
        if name not in GENERATORS:
            raise _refuse(f"the table function '{name}' (only generators: {_list(GENERATORS)})")
        _check(target, ctes, found)
    else:
        db, catalog = node.args.get("db"), node.args.get("catalog")
        if db is not None or catalog is not None:
            qualified = node.sql(dialect=DIALECT).split(" ")[0]
            if db is not None and catalog is None and db.name.lower() in _FILE_FORMATS:
                raise _refuse(f"the file-path table {qualified} (it reads files)")
            raise _refuse(
                f"the qualified table name {qualified}: only the job's inputs "
                f"({_list(found.inputs.values())}) and CTEs"
            )
        if not isinstance(target, exp.Identifier):
            raise _refuse(f"{_describe(node)} as a table")
        key = target.name.lower()
        if key in ctes:
            pass
        elif key in found.inputs:
            found.tables.add(found.inputs[key])
        else:
            raise _refuse(
                f"the query: table '{target.name}' is not an input of this job "
                f"(inputs: {_list(found.inputs.values())})"
            )
    for key, value in node.args.items():
        if key in ("this", "db", "catalog") or value in (None, False, [], ""):
            continue
        if key not in _TABLE_ARGS:
            raise _refuse(f"the table clause {key.upper()} in {node.sql(dialect=DIALECT)!r}")
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, exp.Expression):
                _check(item, ctes, found)


def _check_lateral(node: exp.Lateral, ctes: frozenset[str], found: _Found) -> None:
    target = node.this
    if isinstance(target, exp.Func):
        name = _function_name(target)
        if name not in GENERATORS - {"range"}:
            raise _refuse(f"LATERAL VIEW with '{name}' (only generators: {_list(GENERATORS)})")
    elif not isinstance(target, exp.Subquery):
        raise _refuse(f"{_describe(node)}")
    if node.args.get("cross_apply") is not None:
        raise _refuse("CROSS/OUTER APPLY")
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
            raise _refuse(f"the hint {hint.sql(dialect=DIALECT)!r}")
        if name.lower() not in HINTS:
            raise _refuse(f"the hint {name!r} (allowed: {_list(HINTS)})")
        for arg in _children(hint):
            plain_table = isinstance(arg, exp.Table) and isinstance(arg.this, exp.Identifier)
            if plain_table and not (arg.args.get("db") or arg.args.get("catalog")):
                continue
            if isinstance(arg, (exp.Literal, exp.Identifier)) or (
                isinstance(arg, exp.Column) and not arg.table
            ):
                continue
            raise _refuse(f"the hint argument {arg.sql(dialect=DIALECT)!r} in {name}")


def _function_name(node: exp.Func) -> str:
    if isinstance(node, (exp.Anonymous, exp.AnonymousAggFunc)):
        return node.name.lower()
    return node.sql_name().lower()


def _check_function(node: exp.Func) -> None:
    if isinstance(node, (exp.Anonymous, exp.AnonymousAggFunc)):
        name = node.name.lower()
        _check_name(name)
        if not isinstance(node.this, str) or not _SIMPLE_NAME.fullmatch(name):
            raise _refuse(f"the quoted or unusual function name {node.this!r}")
        if name not in SPARK_EXTRA_FUNCTIONS:
            raise _refuse(
                f"the query: function '{name}' is not allowed (not a Spark built-in on the allowlist)"
            )
        return
    for name in [n.lower() for n in type(node).sql_names()] or [type(node).__name__.lower()]:
        _check_name(name)
    if isinstance(node, _DENIED_CLASSES):
        raise _refuse(f"the query: function '{_function_name(node)}' is not allowed")


def _check_name(name: str) -> None:
    if name.startswith("java_") or name in DENIED_FUNCTIONS:
        why = DENIED_FUNCTIONS.get(name, "it calls Java methods")
        raise _refuse(f"the query: function '{name}' is not allowed ({why})")


def _list(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"


# --- the second wall: Spark's own parser --------------------------------------------------------

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
    if text.startswith("[") and text.endswith("]") and _SIMPLE_NAME.fullmatch(text[1:-1]):
        return text[1:-1]
    return None


def plan_parser(session: Any) -> Any:
    """The session whose JVM parses a query for `check_spark_plan`: the task's own, or, for a
    Spark Connect session (which exposes no parser), the host's local JVM (the same Spark)."""
    if type(session).__module__.startswith("pyspark.sql.connect"):
        from trace_platform.spark import get_spark

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
        from trace_platform.spark import spark_error_text

        raise SqlRefused(f"sql_transform cannot parse the query: {spark_error_text(e)}") from None
    builtins = _spark_builtins(spark)
    allowed_tables = {t.lower() for t in checked.tables} | set(checked.ctes)
    for node in _plan_nodes(tree):
        cls = str(node["class"]).rsplit(".", 1)[-1]
        if cls == "ScriptTransformation":
            raise _refuse("TRANSFORM … USING (runs a program)")
        if any(word in cls for word in _PLAN_DENIED):
            raise _refuse(f"the query: Spark reads it as {cls}")
        if cls == "UnresolvedRelation":
            name = _one_name(node.get("multipartIdentifier"))
            if name is None or name.lower() not in allowed_tables:
                raise _refuse(
                    f"the query: table {node.get('multipartIdentifier')} is not an input of this "
                    f"job (inputs: {_list(checked.tables)})"
                )
        elif cls == "UnresolvedTableValuedFunction":
            name = _one_name(node.get("name"))
            if name is None or name.lower() not in GENERATORS:
                raise _refuse(f"the table function {node.get('name')}")
        elif cls == "UnresolvedFunction":
            name = _one_name(node.get("nameParts"))
            if name is None:
                raise _refuse(f"the qualified function name {node.get('nameParts')}")
            _check_name(name.lower())
            if name.lower() not in builtins:
                raise _refuse(f"the query: function '{name}' is not a Spark built-in")
