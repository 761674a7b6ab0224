"""What a user's SQL may touch: one SELECT over dataset names, computing with allowlisted functions.

The statement is parsed by DuckDB itself (`json_serialize_sql`), so what is checked is the tree
DuckDB will bind, and it is checked against allowlists, never a denylist. Accepted:

- exactly one statement, a SELECT (set operations, CTEs, subqueries, VALUES, PIVOT/UNPIVOT with
  an explicit IN list);
- every query node, table reference and expression of a kind listed below (`_QUERY_NODES`,
  `_TABLE_REFS`, `_EXPRESSION_CLASSES`); a kind DuckDB adds later is refused until reviewed;
- every function call (scalar, operator, aggregate, window; wherever it sits: select list,
  WHERE, GROUP BY, HAVING, QUALIFY, ORDER BY, window frames, FILTER, lambda bodies, COLUMNS(…),
  CASE, subqueries, CTEs, PIVOT aggregates) named in `ALLOWED_FUNCTIONS`, by its plain name (no
  schema or catalog but the `main.` DuckDB's parser writes itself); the list-aggregate functions
  (`list_aggr`, …) only with an allowed aggregate's name as a string literal;
- the SQL value keywords DuckDB's binder turns into calls (`user`, `current_schema`, …, see
  `_VALUE_KEYWORDS`) only where the call they make is allowed;
- casts only to DuckDB's built-in types, COLLATE only with built-in collations;
- every table reference an unqualified name that is a CTE in scope (a CTE's body sees the CTEs
  before it; a recursive CTE's recursive branch, not its anchor, sees itself; nothing outside a
  statement sees its CTEs) or else a dataset name: the names returned for the registry to
  resolve, or, when the caller passes `datasets`, one of those. Names of DuckDB's own catalog
  views (`pg_settings`, `duckdb_tables`, `sqlite_master`, …) are never dataset names unless the
  caller passes them.

Refused, naming what was refused: table functions anywhere (`read_csv`, `query_table`,
`postgres_scan`, `range()` in FROM …), SHOW/DESCRIBE/SUMMARIZE as a table, qualified names,
`AT (…)` time travel, PIVOT over an ENUM type, EXPORT_STATE, and every statement that is not a
SELECT (SET, PRAGMA, ATTACH, COPY, EXPORT, INSTALL, LOAD, CALL, CREATE MACRO, PREPARE/EXECUTE …).

The allowlist rule. `ALLOWED_FUNCTIONS` was built by hand from `duckdb_functions()` of DuckDB
1.5.5 (core, icu, json and parquet, the extensions built into the wheel): the scalar functions,
operators, aggregates, window functions and built-in macros that compute their result from their
arguments alone (the clock and the random generator aside). Left out, whatever else they do:

- anything that reads settings, variables, secrets, sequences or the session
  (`current_setting`, `getvariable`, `current_database`, `current_schema(s)`, `current_query`,
  `current_user`, `txid_current`, `in_search_path`, `nextval`, `currval`, `version`, `stats`);
- anything that reads the catalog, directly or as a macro (`pg_get_viewdef`,
  `pg_get_constraintdef`, `format_type`, `get_block_size`, every `pg_*`/`has_*_privilege`/`inet_*`
  compatibility macro, `col_description` …);
- anything that binds or runs SQL text (`json_serialize_sql`, `json_deserialize_sql`,
  `json_serialize_plan`, `json_execute_serialized_sql`, `query`, `query_table`,
  `sql_auto_complete`);
- anything that reads or names files or logs (`read_*`, `parse_path` and friends,
  `parse_duckdb_log_message`), changes state or sleeps (`setseed`, `write_log`, `sleep_ms`,
  `pg_sleep`), or builds a type from text (`make_type`);
- every table function, every pragma, every extension function (postgres_scanner's
  `postgres_scan`/`postgres_query`, httpfs …: not built in, so not listed);
- internals (`__internal_*`, `constant_or_null`, `vector_type`, `finalize`, `combine`,
  `sum_no_overflow`, `unpivot_list`, `timetz_byte_comparable`, the `variant_*` Parquet
  converters, `st_crs`/`st_setcrs`) and the `icu_collate_*`/`icu_sort_key` collation functions
  (use COLLATE).

`tests/unit/test_query_guard.py` checks that every allowlisted name is a scalar, aggregate or
macro of this DuckDB (so an upgrade that drops or turns one into something else fails loudly) and
`tests/unit/test_query_guard_fuzz.py` fuzzes the guard against a sandboxed engine. The engine's
own sandbox (external access off, configuration locked) stays the second wall."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterable
from typing import Any

import duckdb

from trace_platform.errors import Invalid

MAX_SQL_CHARS = 100_000

# fmt: off
_OPERATORS = (
    "!__postfix", "!~~", "!~~*", "%", "&", "&&", "*", "**", "+", "-", "->>", "/", "//", "<->",
    "<<", "<=>", "<@", ">>", "@", "@>", "^", "^@", "|", "||", "~", "~~", "~~*", "~~~",
)
_MATH = (
    "abs", "acos", "acosh", "add", "asin", "asinh", "atan", "atan2", "atanh", "bit_count", "cbrt",
    "ceil", "ceiling", "cos", "cosh", "cot", "degrees", "divide", "equi_width_bins", "even", "exp",
    "factorial", "fdiv", "floor", "fmod", "gamma", "gcd", "greatest", "greatest_common_divisor",
    "isfinite", "isinf", "isnan", "lcm", "least", "least_common_multiple", "lgamma", "ln", "log",
    "log10", "log2", "mod", "multiply", "nextafter", "pi", "pow", "power", "radians", "random",
    "round", "round_even", "roundbankers", "sign", "signbit", "sin", "sinh", "sqrt", "subtract",
    "tan", "tanh", "trunc", "xor",
)
_STRING = (
    "ascii", "bar", "base64", "bin", "bit_length", "bit_position", "bitstring", "char_length",
    "character_length", "chr", "concat", "concat_ws", "contains", "damerau_levenshtein", "decode",
    "editdist3", "encode", "ends_with", "format", "format_bytes", "formatreadabledecimalsize",
    "formatreadablesize", "from_base64", "from_binary", "from_hex", "get_bit", "hamming", "hash",
    "hex", "ilike_escape", "instr", "jaccard", "jaro_similarity", "jaro_winkler_similarity",
    "lcase", "left", "left_grapheme", "len", "length", "length_grapheme", "levenshtein",
    "like_escape", "lower", "lpad", "ltrim", "md5", "md5_number", "md5_number_lower",
    "md5_number_upper", "mismatches", "nfc_normalize", "not_ilike_escape", "not_like_escape",
    "octet_length", "ord", "parse_formatted_bytes", "position", "prefix", "printf",
    "regexp_escape", "regexp_extract", "regexp_extract_all", "regexp_full_match",
    "regexp_matches", "regexp_replace", "regexp_split_to_array", "regexp_split_to_table",
    "repeat", "replace", "reverse", "right", "right_grapheme", "rpad", "rtrim", "set_bit", "sha1",
    "sha256", "split", "split_part", "starts_with", "str_split", "str_split_regex",
    "string_split", "string_split_regex", "string_to_array", "strip_accents", "strlen", "strpos",
    "substr", "substring", "substring_grapheme", "suffix", "to_base", "to_base64", "to_binary",
    "to_hex", "translate", "trim", "ucase", "unbin", "unhex", "unicode", "upper", "url_decode",
    "url_encode",
)
_DATE_TIME = (
    "age", "ago", "century", "current_date", "current_localtime", "current_localtimestamp",
    "date_add", "date_diff", "date_part", "date_sub", "date_trunc", "datediff", "datepart",
    "datesub", "datetrunc", "day", "dayname", "dayofmonth", "dayofweek", "dayofyear",
    "days_in_month", "decade", "epoch", "epoch_ms", "epoch_ns", "epoch_us", "era",
    "get_current_time", "get_current_timestamp", "hour", "isodow", "isoyear", "julian",
    "last_day", "make_date", "make_time", "make_timestamp", "make_timestamp_ms",
    "make_timestamp_ns", "make_timestamptz", "microsecond", "millennium", "millisecond", "minute",
    "month", "monthname", "nanosecond", "normalized_interval", "now", "quarter", "second",
    "strftime", "strptime", "time_bucket", "timezone", "timezone_hour", "timezone_minute",
    "to_centuries", "to_days", "to_decades", "to_hours", "to_microseconds", "to_millennia",
    "to_milliseconds", "to_minutes", "to_months", "to_quarters", "to_seconds", "to_timestamp",
    "to_weeks", "to_years", "today", "transaction_timestamp", "try_strptime", "week", "weekday",
    "weekofyear", "year", "yearweek",
)
_LIST = (
    "aggregate", "apply", "array_aggr", "array_aggregate", "array_append", "array_apply",
    "array_cat", "array_concat", "array_contains", "array_cosine_distance",
    "array_cosine_similarity", "array_cross_product", "array_distance", "array_distinct",
    "array_dot_product", "array_extract", "array_filter", "array_grade_up", "array_has",
    "array_has_all", "array_has_any", "array_indexof", "array_inner_product", "array_intersect",
    "array_length", "array_negative_dot_product", "array_negative_inner_product",
    "array_pop_back", "array_pop_front", "array_position", "array_prepend", "array_push_back",
    "array_push_front", "array_reduce", "array_resize", "array_reverse", "array_reverse_sort",
    "array_select", "array_slice", "array_sort", "array_to_string",
    "array_to_string_comma_default", "array_transform", "array_unique", "array_value",
    "array_where", "array_zip", "cardinality", "element_at", "filter", "flatten",
    "generate_series", "generate_subscripts", "grade_up", "list_aggr", "list_aggregate",
    "list_any_value", "list_append", "list_apply", "list_approx_count_distinct", "list_avg",
    "list_bit_and", "list_bit_or", "list_bit_xor", "list_bool_and", "list_bool_or", "list_cat",
    "list_concat", "list_contains", "list_cosine_distance", "list_cosine_similarity",
    "list_count", "list_distance", "list_distinct", "list_dot_product", "list_element",
    "list_entropy", "list_extract", "list_filter", "list_first", "list_grade_up", "list_has",
    "list_has_all", "list_has_any", "list_histogram", "list_indexof", "list_inner_product",
    "list_intersect", "list_kurtosis", "list_kurtosis_pop", "list_last", "list_mad", "list_max",
    "list_median", "list_min", "list_mode", "list_negative_dot_product",
    "list_negative_inner_product", "list_pack", "list_position", "list_prepend", "list_product",
    "list_reduce", "list_resize", "list_reverse", "list_reverse_sort", "list_select", "list_sem",
    "list_skewness", "list_slice", "list_sort", "list_stddev_pop", "list_stddev_samp",
    "list_string_agg", "list_sum", "list_transform", "list_unique", "list_value",
    "list_var_pop", "list_var_samp", "list_where", "list_zip", "range", "reduce", "unnest",
)
_STRUCT_MAP_UNION = (
    "map", "map_concat", "map_contains", "map_contains_entry", "map_contains_value",
    "map_entries", "map_extract", "map_extract_value", "map_from_entries", "map_keys",
    "map_values", "remap_struct", "row", "struct_concat", "struct_contains", "struct_extract",
    "struct_extract_at", "struct_has", "struct_indexof", "struct_insert", "struct_keys",
    "struct_pack", "struct_position", "struct_update", "struct_values", "switch",
    "union_extract", "union_tag", "union_value", "variant_extract", "variant_normalize",
    "variant_typeof",
)
_JSON = (
    "array_to_json", "from_json", "from_json_strict", "json", "json_array", "json_array_length",
    "json_contains", "json_exists", "json_extract", "json_extract_path", "json_extract_path_text",
    "json_extract_string", "json_group_array", "json_group_object", "json_group_structure",
    "json_keys", "json_merge_patch", "json_object", "json_pretty", "json_quote",
    "json_structure", "json_transform", "json_transform_strict", "json_type", "json_valid",
    "json_value", "row_to_json", "to_json",
)
_TYPES_AND_MISC = (
    "alias", "can_cast_implicitly", "cast_to_type", "create_sort_key", "enum_code", "enum_first",
    "enum_last", "enum_range", "enum_range_boundary", "error", "gen_random_uuid", "get_type",
    "is_histogram_other_bin", "nullif", "replace_type", "st_asbinary", "st_astext", "st_aswkb",
    "st_aswkt", "st_geomfromwkb", "st_intersects_extent", "typeof", "uuid",
    "uuid_extract_timestamp", "uuid_extract_version", "uuidv4", "uuidv7",
)
# Aggregates (usable as window functions too) and the window-only functions.
ALLOWED_AGGREGATES = frozenset((
    "any_value", "approx_count_distinct", "approx_quantile", "approx_top_k", "arbitrary",
    "arg_max", "arg_max_null", "arg_max_nulls_last", "arg_min", "arg_min_null",
    "arg_min_nulls_last", "argmax", "argmin", "array_agg", "avg", "bit_and", "bit_or", "bit_xor",
    "bitstring_agg", "bool_and", "bool_or", "corr", "count", "count_if", "count_star", "countif",
    "covar_pop", "covar_samp", "entropy", "favg", "first", "fsum", "geomean", "geometric_mean",
    "group_concat", "histogram", "histogram_exact", "kahan_sum", "kurtosis", "kurtosis_pop",
    "last", "list", "listagg", "mad", "max", "max_by", "mean", "median", "min", "min_by", "mode",
    "product", "quantile", "quantile_cont", "quantile_disc", "regr_avgx", "regr_avgy",
    "regr_count", "regr_intercept", "regr_r2", "regr_slope", "regr_sxx", "regr_sxy", "regr_syy",
    "reservoir_quantile", "sem", "skewness", "stddev", "stddev_pop", "stddev_samp", "string_agg",
    "sum", "sumkahan", "var_pop", "var_samp", "variance", "wavg", "weighted_avg",
))
_WINDOW = (
    "cume_dist", "dense_rank", "fill", "first_value", "lag", "last_value", "lead", "nth_value",
    "ntile", "percent_rank", "rank", "rank_dense", "row_number",
)
# fmt: on

ALLOWED_FUNCTIONS: frozenset[str] = frozenset(
    (
        *_OPERATORS,
        *_MATH,
        *_STRING,
        *_DATE_TIME,
        *_LIST,
        *_STRUCT_MAP_UNION,
        *_JSON,
        *_TYPES_AND_MISC,
        *ALLOWED_AGGREGATES,
        *_WINDOW,
    )
)

# Functions whose second argument names an aggregate to run over a list.
_NAMED_AGGREGATE = {"aggregate", "array_aggr", "array_aggregate", "list_aggr", "list_aggregate"}

# A COLUMN_REF DuckDB's binder turns into a call when no column of that name is in scope
# (`GetSQLValueFunctionName`): the keyword, and the function it calls.
_VALUE_KEYWORDS = {
    "current_catalog": "current_catalog",
    "current_date": "current_date",
    "current_role": "current_role",
    "current_schema": "current_schema",
    "current_time": "get_current_time",
    "current_timestamp": "get_current_timestamp",
    "current_user": "current_user",
    "localtime": "current_localtime",
    "localtimestamp": "current_localtimestamp",
    "session_user": "session_user",
    "user": "user",
}

_QUERY_NODES = {"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE"}
_TABLE_REFS = {"BASE_TABLE", "JOIN", "SUBQUERY", "EXPRESSION_LIST", "EMPTY", "PIVOT"}
_EXPRESSION_CLASSES = {
    "BETWEEN",
    "CASE",
    "CAST",
    "COLLATE",
    "COLUMN_REF",
    "COMPARISON",
    "CONJUNCTION",
    "CONSTANT",
    "FUNCTION",
    "LAMBDA",
    "LAMBDA_REF",
    "OPERATOR",
    "PARAMETER",
    "POSITIONAL_REFERENCE",
    "STAR",
    "SUBQUERY",
    "WINDOW",
}
_CATALOG_PREFIXES = ("duckdb_", "pragma_", "sqlite_", "pg_")

_parser = duckdb.connect(":memory:")  # parsing only; never sees data
_parser_lock = threading.Lock()
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _fold(name: str) -> str:
    """Case-folds an identifier the way DuckDB compares them: ASCII letters only (Python's
    lower() also folds e.g. the Kelvin sign to 'k', which DuckDB does not)."""
    return name.translate(_ASCII_LOWER)


def _catalog_sets() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """DuckDB's own catalog views an unqualified name can reach, its built-in type names and its
    collations, read once from a connection with nothing of ours in it."""
    with _parser_lock:
        views = _parser.execute(
            "SELECT view_name FROM duckdb_views() WHERE internal "
            "AND schema_name IN ('main', 'pg_catalog')"
        ).fetchall()
        types = _parser.execute("SELECT DISTINCT type_name FROM duckdb_types()").fetchall()
        collations = _parser.execute("SELECT collname FROM pragma_collations()").fetchall()
    return (
        frozenset(_fold(v) for (v,) in views),
        frozenset(_fold(t) for (t,) in types),
        frozenset(_fold(c) for (c,) in collations) | {"binary"},
    )


_CATALOG_VIEWS, _BUILTIN_TYPES, _COLLATIONS = _catalog_sets()


class QueryRefused(Invalid):
    code = "query_refused"


_FUNCTIONS_HINT = (
    "the Query Service allows computing functions only: string, math, date/time, list, struct, "
    "map, JSON, aggregate and window functions"
)


def _qualified(*parts: Any) -> str:
    return ".".join(str(p) for p in parts if p)


def _check_function(node: dict[str, Any]) -> None:
    raw = str(node.get("function_name", ""))
    name = _fold(raw)
    schema, catalog = node.get("schema") or "", node.get("catalog") or ""
    if catalog or _fold(schema) not in ("", "main"):
        raise QueryRefused(
            f"function '{_qualified(catalog, schema, raw)}' is not allowed: call functions by "
            "their plain name (lower(x), not x.lower() or schema.lower(x))"
        )
    if name not in ALLOWED_FUNCTIONS:
        raise QueryRefused(f"function '{raw}' is not allowed ({_FUNCTIONS_HINT})")
    if node.get("export_state"):
        raise QueryRefused(f"EXPORT_STATE is not allowed (on '{raw}')")
    if name in _NAMED_AGGREGATE:
        children = node.get("children") or []
        arg = children[1] if len(children) > 1 else {}
        value = arg.get("value") if isinstance(arg, dict) else None
        agg = value.get("value") if isinstance(value, dict) else None
        if arg.get("class") != "CONSTANT" or not isinstance(agg, str):
            raise QueryRefused(
                f"function '{raw}' takes the aggregate's name as a string literal, "
                f"e.g. {raw}(l, 'sum')"
            )
        if _fold(agg) not in ALLOWED_AGGREGATES:
            raise QueryRefused(f"aggregate '{agg}' is not allowed (in {raw})")


def _check_expression(node: dict[str, Any]) -> None:
    cls = node["class"]
    if cls not in _EXPRESSION_CLASSES:
        raise QueryRefused(f"expressions of kind {cls} are not allowed")
    if cls in ("FUNCTION", "WINDOW"):
        _check_function(node)
    elif cls == "COLUMN_REF":
        parts = [_fold(str(p)) for p in node.get("column_names") or []]
        keyword = None
        if parts and parts[0] in _VALUE_KEYWORDS:
            keyword = parts[0]
        elif len(parts) > 1 and parts[0] == "alias" and parts[1] in _VALUE_KEYWORDS:
            keyword = parts[1]  # `alias.user` is the keyword too (IsPotentialAlias)
        if keyword and _VALUE_KEYWORDS[keyword] not in ALLOWED_FUNCTIONS:
            raise QueryRefused(
                f"function '{_VALUE_KEYWORDS[keyword]}' is not allowed (the keyword {keyword} "
                f"calls it; a column of that name is read as t.{keyword})"
            )
    elif cls == "COLLATE":
        collation = str(node.get("collation", ""))
        if not all(_fold(p) in _COLLATIONS for p in collation.split(".")):
            raise QueryRefused(f"collation '{collation}' is not allowed")


def _check_type(info: dict[str, Any]) -> None:
    name = str(info.get("name", ""))
    if info.get("catalog") or info.get("schema") or _fold(name) not in _BUILTIN_TYPES:
        shown = _qualified(info.get("catalog"), info.get("schema"), name)
        raise QueryRefused(f"type '{shown}' is not allowed: cast to DuckDB's built-in types")


def _table_ref(node: dict[str, Any], scope: frozenset[str], tables: set[str]) -> None:
    """Checks one table reference (not its children)."""
    kind = node.get("type")
    if kind == "TABLE_FUNCTION":
        fn = node.get("function") or {}
        name = fn.get("function_name", "?") if isinstance(fn, dict) else "?"
        raise QueryRefused(
            f"table function '{name}' is not allowed: table functions are not allowed in "
            "queries, read datasets by name (SELECT … FROM blocks)"
        )
    if kind == "SHOW_REF":
        raise QueryRefused("SHOW/DESCRIBE/SUMMARIZE is not allowed as a table")
    if kind not in _TABLE_REFS:
        raise QueryRefused(f"table references of kind {kind} are not allowed")
    if kind == "BASE_TABLE":
        raw = str(node.get("table_name", ""))
        if node.get("catalog_name") or node.get("schema_name"):
            shown = _qualified(node.get("catalog_name"), node.get("schema_name"), raw)
            raise QueryRefused(
                f"'{shown}' is not a dataset name: qualified names are not allowed, refer to "
                "published datasets by their plain name"
            )
        if node.get("at_clause"):
            raise QueryRefused(f"AT (…) is not allowed (on '{raw}')")
        if not raw.isascii():
            raise QueryRefused(f"'{raw}' is not a dataset name")
        if _fold(raw) not in scope:
            tables.add(_fold(raw))
    elif kind == "PIVOT":
        for pivot in node.get("pivots") or []:
            if isinstance(pivot, dict) and pivot.get("pivot_enum"):
                raise QueryRefused(
                    f"PIVOT … IN {pivot['pivot_enum']} is not allowed: list the values, "
                    "IN ('a', 'b')"
                )


def _walk(tree: Any) -> set[str]:
    """The dataset names the tree reads, or QueryRefused. Iterative (a deep tree cannot exhaust
    the stack); each entry carries the CTE names in scope and whether it must be a table ref."""
    tables: set[str] = set()
    stack: list[tuple[Any, frozenset[str], bool]] = [(tree, frozenset(), False)]
    while stack:
        node, scope, is_table = stack.pop()
        if isinstance(node, list):
            stack.extend((item, scope, is_table) for item in node)
            continue
        if not isinstance(node, dict):
            if is_table and node is not None:
                raise QueryRefused("unsupported table reference")
            continue
        kind = node.get("type")
        if not isinstance(kind, str):
            kind = None  # e.g. a constant's {"type": {"id": …}}
        if is_table:
            _table_ref(node, scope, tables)
            for key, value in node.items():
                child_is_table = (kind == "JOIN" and key in ("left", "right")) or (
                    kind == "PIVOT" and key == "source"
                )
                stack.append((value, scope, child_is_table))
            continue
        if isinstance(node.get("class"), str):
            _check_expression(node)
        elif kind is not None and kind.endswith("_NODE"):
            if kind not in _QUERY_NODES:
                raise QueryRefused(f"query nodes of kind {kind} are not allowed")
            entries = (node.get("cte_map") or {}).get("map") or []
            for entry in entries:
                name = str(entry.get("key", ""))
                if not name.isascii():
                    raise QueryRefused(f"CTE name '{name}' is not allowed (ASCII names only)")
                stack.append((entry.get("value"), scope, False))  # sees earlier CTEs only
                scope = scope | {_fold(name)}
            for key, value in node.items():
                if key == "cte_map":
                    continue
                if kind == "RECURSIVE_CTE_NODE" and key == "right":
                    # The recursive branch sees the CTE itself; the anchor does not (there the
                    # name is the catalog's).
                    inner = scope | {_fold(str(node.get("cte_name", "")))}
                    stack.append((value, inner, False))
                else:
                    stack.append((value, scope, kind == "SELECT_NODE" and key == "from_table"))
            continue
        elif kind in _TABLE_REFS or kind in ("TABLE_FUNCTION", "SHOW_REF"):
            _table_ref(node, scope, tables)  # a table ref found off its usual keys
        elif kind in ("UNBOUND_TYPE_INFO", "USER_TYPE_INFO"):
            _check_type(node)
        stack.extend((value, scope, False) for value in node.values())
    return tables


def dataset_names(sql: str, datasets: Iterable[str] | None = None) -> set[str]:
    """The dataset names a statement reads (lower-cased), or QueryRefused saying why not.

    Without `datasets` every name that is not a CTE is returned for the registry to resolve
    (an unknown one is its 404); with `datasets`, each must be one of them."""
    names = _dataset_names(sql)
    known = None if datasets is None else {_fold(d) for d in datasets}
    for name in sorted(names):
        if known is not None and name not in known:
            raise QueryRefused(f"'{name}' is not a dataset name")
        if known is None and (name in _CATALOG_VIEWS or name.startswith(_CATALOG_PREFIXES)):
            raise QueryRefused(f"'{name}' is not a dataset name (it is DuckDB's catalog)")
    return set(names)


@functools.lru_cache(maxsize=256)  # a pure function of the text; dashboards repeat queries
def _dataset_names(sql: str) -> frozenset[str]:
    if len(sql) > MAX_SQL_CHARS:
        raise QueryRefused(f"the query is longer than {MAX_SQL_CHARS} characters")
    if not sql.strip():
        raise QueryRefused("empty query")
    with _parser_lock:
        try:
            statements = _parser.extract_statements(sql)
        except duckdb.Error as e:
            raise QueryRefused(f"bad SQL: {_first_line(e)}") from None
        if len(statements) != 1:
            raise QueryRefused(f"one statement per query (got {len(statements)})")
        if statements[0].type != duckdb.StatementType.SELECT:
            raise QueryRefused(
                f"only SELECT is allowed (got {statements[0].type.name}): "
                "the Query Service never writes"
            )
        raw = _parser.execute("SELECT json_serialize_sql($1)", [sql]).fetchone()
    assert raw is not None
    try:
        tree = json.loads(raw[0])
    except RecursionError:
        raise QueryRefused("the query is nested too deeply") from None
    if tree.get("error"):
        message = tree.get("error_message", "cannot parse")
        if "Only SELECT" in message:  # e.g. PRAGMA, or a PIVOT that needs a second statement
            raise QueryRefused("only SELECT is allowed: the Query Service never writes")
        raise QueryRefused(f"bad SQL: {message}")
    statements_json = tree.get("statements")
    if not isinstance(statements_json, list) or len(statements_json) != 1:
        raise QueryRefused("one statement per query")
    return frozenset(_walk(statements_json))


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
