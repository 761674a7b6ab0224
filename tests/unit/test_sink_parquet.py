"""The sink's Parquet reading (sink/batch.parse with sink/parquet's plan): batches of every shape
a writer makes read exactly as pyarrow reads them, and every bomb of tests/support/parquet_bombs
is refused having allocated no more than twice the bound (counted by Arrow itself, in a child
process whose default memory pool is the counting one)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.parquet_bombs import BOMBS, LIMIT, parquet
from trace_platform.sink.batch import parse

ROOT = Path(__file__).resolve().parents[2]
_N = 5000
_WORDS = [f"w{i % 97}" * 5 for i in range(_N)]

SHAPES: dict[str, Callable[[], bytes]] = {
    "dictionary_text_and_ints": lambda: parquet(
        pa.table({"k": [f"r{i}" for i in range(_N)], "note": _WORDS, "n": list(range(_N))})
    ),
    "plain_text": lambda: parquet(pa.table({"k": _WORDS}), use_dictionary=False),
    "delta_text": lambda: parquet(
        pa.table({"k": _WORDS}),
        use_dictionary=False,
        column_encoding={"k": "DELTA_BYTE_ARRAY"},
    ),
    "delta_length_text": lambda: parquet(
        pa.table({"k": _WORDS}),
        use_dictionary=False,
        column_encoding={"k": "DELTA_LENGTH_BYTE_ARRAY"},
    ),
    "dictionary_typed": lambda: parquet(pa.table({"k": pa.array(_WORDS).dictionary_encode()})),
    "structs_and_lists": lambda: parquet(
        pa.table(
            {
                "k": [f"r{i}" for i in range(_N)],
                "doc": [{"tags": [w, "x"], "v": i} for i, w in enumerate(_WORDS)],
            }
        )
    ),
    "many_row_groups": lambda: parquet(pa.table({"k": _WORDS}), row_group_size=300),
    "empty": lambda: parquet(pa.table({"k": pa.array([], pa.string())})),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_batches_of_every_shape_read_as_pyarrow_reads_them(shape: str) -> None:
    data = SHAPES[shape]()
    want = pq.read_table(io.BytesIO(data)).to_pylist()
    assert parse(data, "application/parquet", 100_000, 64 * 1024 * 1024) == want


_CHILD = """
import json, os, sys
import pyarrow as pa
from tests.support.parquet_bombs import BOMBS, LIMIT
from trace_platform.sink.batch import BatchRefused, parse

out = {}
for name, (make, _reason) in sorted(BOMBS.items()):
    data = make()
    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    was = pa.default_memory_pool()
    pa.set_memory_pool(pool)
    try:
        parse(data, "application/parquet", 100_000, LIMIT)
        out[name] = ["accepted", pool.max_memory()]
    except BatchRefused as e:
        out[name] = [str(e), pool.max_memory()]
    finally:
        pa.set_memory_pool(was)
print(json.dumps(out), flush=True)
os._exit(0)  # no teardown: buffers of the counting pools may outlive them
"""


def test_bombs_are_refused_having_allocated_at_most_twice_the_bound() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(got) == sorted(BOMBS)
    for name, (error, peak) in got.items():
        assert BOMBS[name][1] in error, (name, error)
        assert peak <= 2 * LIMIT, (name, peak)
