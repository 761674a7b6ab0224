"""Running a real Spark operator in-process over a local object store, as a worker's operator
host would: its task payload (inputs with their committed scopes, one output), its scratch
directory, the store. For tests and benches of operator code without the whole stack."""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from uuid import uuid4

import pyarrow as pa
import pyarrow.parquet as pq

from trace_platform.contract import CommittedScope, DatasetRef, RangeSpec, TaskPayload, scope_key
from trace_platform.objectstore.local import LocalStore
from trace_platform.operators.context import OperatorContext, OperatorResult

Operator = Callable[[OperatorContext], OperatorResult]


def put_table(store: LocalStore, prefix: str, table: pa.Table) -> str:
    """`table` as one Parquet file under `prefix`; returns the prefix."""
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.put(f"{prefix.rstrip('/')}/part-00000.parquet", buf.getvalue())
    return prefix


def run_operator(
    fn: Operator,
    store: LocalStore,
    workdir: Path,
    inputs: list[tuple[str | None, str]],
    output: str,
    config: dict[str, Any] | None = None,
    rng: RangeSpec | None = None,
    unique_key: list[str] | None = None,
    output_committed: Sequence[tuple[RangeSpec, str]] = (),
    input_range: RangeSpec | None = None,
) -> tuple[OperatorResult, str]:
    """Runs `fn` with `inputs` ((dataset name, committed location) each, committed whole, or
    as the range `rng` when given) and one output at `output` (an `append` output with
    `unique_key`, whose version already holds `output_committed`, when given); returns its
    result and where it wrote (the committed location). `input_range` commits the inputs as
    that range without making it the input event's."""
    held = rng or input_range
    scope = scope_key(None, held)
    out = DatasetRef(
        dataset_uuid=uuid4(),
        dataset_version=uuid4(),
        location=output,
        update_strategy="append" if unique_key else None,
        unique_key=unique_key,
    )
    refs = [
        DatasetRef(dataset_uuid=uuid4(), dataset_version=uuid4(), dataset_name=name, location=loc)
        for name, loc in inputs
    ]
    task = TaskPayload.model_construct(
        task_id=uuid4(),
        attempt=1,
        operator=fn.__name__,
        config=config or {},
        inputs=refs,
        outputs=[out],
        committed=[
            *(
                CommittedScope(
                    dataset_uuid=r.dataset_uuid,
                    dataset_version=r.dataset_version,
                    scope=scope,
                    range=held,
                    location=r.location,
                )
                for r in refs
                if r.dataset_version is not None and r.location is not None
            ),
            *(
                CommittedScope(
                    dataset_uuid=out.dataset_uuid,
                    dataset_version=out.dataset_version,
                    scope=scope_key(None, r),
                    range=r,
                    location=loc,
                )
                for r, loc in output_committed
            ),
        ],
        input_event={"range": rng.model_dump()} if rng is not None else None,
    )
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    ctx = OperatorContext(task=task, workdir=workdir, _send=lambda _m: None, _store=store)
    try:
        result = fn(ctx)
    finally:
        ctx.close()
    return result, result.outputs[0].location


def read_output(store: LocalStore, location: str) -> pa.Table:
    """What an operator committed at `location`, as one Arrow table (schema metadata kept)."""
    files = sorted((store.root / location).glob("*.parquet"))
    return pa.concat_tables(pq.read_table(f) for f in files)
