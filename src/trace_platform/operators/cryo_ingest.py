"""cryo_ingest: one block range of raw chain data into the task's output dataset versions.

Input: a range manifest event ([start, end)). Config: `datatypes` (one per output, in order;
default blocks, transactions, logs, geth_calls — Monad has no trace_* methods), `rpc_url`
(else the slot's RPC_URL env), `network_name`, `requests_per_second`,
`max_concurrent_requests`. Files land under `{version}/range={start}-{end}/t={task}.{attempt}/`:
each attempt writes its own keys and its commit swaps the range's location, so a re-run never
duplicates rows nor touches files a reader may have pinned (see operators/output.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from trace_platform.contract import EventIn, OutputCommit, RangeSpec
from trace_platform.operators.config import OperatorConfig
from trace_platform.operators.context import (
    OperatorContext,
    OperatorError,
    OperatorResult,
    PermanentError,
)
from trace_platform.operators.output import attempt_prefix, range_prefix

DEFAULT_DATATYPES = ["blocks", "transactions", "logs", "geth_calls"]
# What Cryo extracts from a block range alone, one file per datatype (datatypes that need
# addresses, calls or scripts, and the multi-file groups, are not something this operator runs).
KNOWN_DATATYPES = frozenset(
    {
        "address_appearances",
        "balance_diffs",
        "balance_reads",
        "blocks",
        "code_diffs",
        "code_reads",
        "contracts",
        "erc20_transfers",
        "erc721_transfers",
        "four_byte_counts",
        "geth_balance_diffs",
        "geth_calls",
        "geth_code_diffs",
        "geth_nonce_diffs",
        "geth_opcodes",
        "geth_storage_diffs",
        "logs",
        "native_transfers",
        "nonce_diffs",
        "nonce_reads",
        "storage_diffs",
        "storage_reads",
        "traces",
        "transactions",
        "vm_traces",
    }
)


def _known_datatype(value: str) -> str:
    if value not in KNOWN_DATATYPES:
        raise ValueError(
            f"unknown datatype '{value}' (known: {', '.join(sorted(KNOWN_DATATYPES))})"
        )
    return value


class CryoIngestConfig(OperatorConfig):
    """One output per datatype, in order."""

    datatypes: list[Annotated[str, AfterValidator(_known_datatype)]] = Field(
        default_factory=lambda: list(DEFAULT_DATATYPES), min_length=1, max_length=64
    )
    rpc_url: str | None = Field(default=None, max_length=2048)
    network_name: str = Field(default="devnet", min_length=1, max_length=128)
    requests_per_second: int = Field(default=200, ge=1, le=1_000_000)
    max_concurrent_requests: int = Field(default=4, ge=1, le=1024)

    def job_problems(self, inputs: int, outputs: int) -> list[tuple[str, str]]:
        if len(self.datatypes) != outputs:
            return [
                (
                    "config.datatypes",
                    f"{len(self.datatypes)} datatypes but {outputs} outputs: one output per "
                    "datatype, in order",
                )
            ]
        return []


def cryo_ingest(ctx: OperatorContext) -> OperatorResult:
    import cryo
    import pyarrow.parquet as pq

    event = ctx.task.input_event or {}
    rng = event.get("range")
    if not rng:
        raise PermanentError("cryo_ingest needs a range manifest event (from range_splitter)")
    start, end = int(rng["start"]), int(rng["end"])
    cfg = CryoIngestConfig.from_ctx(ctx)
    datatypes = cfg.datatypes
    if len(datatypes) != len(ctx.task.outputs):
        raise PermanentError(
            f"{len(datatypes)} datatypes but {len(ctx.task.outputs)} outputs: one output per datatype"
        )
    rpc = cfg.rpc_url or ctx.env.get("RPC_URL")
    if not rpc:
        raise PermanentError("no RPC: set config.rpc_url or RPC_URL in the worker pool slot")
    store = ctx.store
    result = OperatorResult()
    for datatype, out in zip(datatypes, ctx.task.outputs, strict=True):
        stage = ctx.workdir / datatype
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        cryo.freeze(
            [datatype],
            blocks=[f"{start}:{end}"],
            rpc=rpc,
            output_dir=str(stage),
            network_name=cfg.network_name,
            requests_per_second=cfg.requests_per_second,
            max_concurrent_requests=cfg.max_concurrent_requests,
            chunk_size=max(1, end - start),
            overwrite=True,
            no_verbose=True,
        )
        produced = sorted(Path(stage).glob("*.parquet"))
        if len(produced) != 1:
            # Cryo reports failed chunks but does not raise: a missing file is a failed range.
            raise OperatorError(
                f"cryo produced {len(produced)} files for {datatype} blocks {start}-{end} "
                "(expected 1; the node may have failed some requests, see the worker log)"
            )
        assert out.location is not None and out.dataset_version is not None
        prefix = attempt_prefix(range_prefix(out.location, start, end), ctx.task)
        rows = size = 0
        for f in produced:
            # Rewrite with pyarrow: Spark's reader rejects some pages polars writes
            # ("Corrupted RLE data"); the stored files must be readable by every engine.
            table = pq.read_table(f)
            pq.write_table(table, f, compression="zstd")
            rows += table.num_rows
            size += f.stat().st_size
            store.put_file(prefix + f.name, f)
        result.outputs.append(
            OutputCommit(
                dataset_uuid=out.dataset_uuid,
                dataset_version=out.dataset_version,
                range=RangeSpec(start=start, end=end),
                location=prefix,
                row_count=rows,
                byte_count=size,
            )
        )
        result.events.append(
            EventIn(
                dataset_uuid=out.dataset_uuid,
                range=RangeSpec(start=start, end=end),
                payload={"datatype": datatype, "rows": rows, "location": prefix},
            )
        )
        ctx.progress(datatype=datatype, rows=rows)
    return result
