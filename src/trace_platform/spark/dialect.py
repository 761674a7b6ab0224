"""The SQL dialect every sqlglot parse and render of Spark SQL uses (the guard, the u256 helpers
and their templates): one definition, so a query reads the same wherever it is handled."""

from __future__ import annotations

from sqlglot.dialects.spark import Spark


class TraceSpark(Spark):
    """sqlglot's Spark dialect, lexing strings as Spark 4 does: `'it''s'` is one literal (`it's`),
    not two adjacent ones, so the regenerated text means what the user wrote."""

    class Tokenizer(Spark.Tokenizer):
        STRING_ESCAPES = ["\\", "'", '"']  # a quote doubled inside its own quotes


DIALECT = TraceSpark
