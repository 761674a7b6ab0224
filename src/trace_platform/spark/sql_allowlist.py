"""The allowlist `sql_guard` checks a query against: the functions refused by name, the Spark
built-ins sqlglot does not know, the generators, hints and syntax nodes a read query may hold.
Data only; the walk that applies it is `trace_platform.spark.sql_guard`."""

from __future__ import annotations

import re

from sqlglot import exp


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
DENIED_CLASSES: tuple[type[exp.Expression], ...] = (
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
SYNTAX: tuple[type[exp.Expression], ...] = (
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

QUERY_ROOTS = (exp.Select, exp.SetOperation, exp.Values, exp.Subquery)

# Names Spark knows as data source formats: `fmt.\`path\`` reads that file.
FILE_FORMATS = _names(
    "parquet text csv json orc avro binaryfile delta jdbc libsvm image xml hive noop"
)

SIMPLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

READ_QUERY = "it accepts one read query (SELECT, WITH … SELECT, a set operation or VALUES)"
