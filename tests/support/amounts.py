"""Amounts as the platform stores them (`trace_platform.spark.u256`: nine BIGINT limbs base
10^9 in floor form), made and read back in plain Python, for test data and checks."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from trace_platform.spark.u256 import BASE, FIELDS, LIMBS, TOP

ARROW_LIMBS = pa.struct([(f, pa.int64()) for f in FIELDS])
SPARK_LIMBS = LIMBS


def limbs(value: int) -> dict[str, int]:
    """`value` as limbs (floor form: l0..l7 in [0, 10^9), l8 signed)."""
    out: dict[str, int] = {}
    for k in range(TOP):
        value, out[f"l{k}"] = divmod(value, BASE)
    out[f"l{TOP}"] = value
    return {f: out[f] for f in FIELDS}


def value(limbs_: Any) -> int | None:
    """The integer of limbs (a dict, a Spark Row or a tuple in field order), None for NULL."""
    if limbs_ is None:
        return None
    fields = [limbs_[f] for f in FIELDS] if isinstance(limbs_, dict) else list(limbs_)
    return sum(int(x) * BASE ** (TOP - i) for i, x in enumerate(fields))
