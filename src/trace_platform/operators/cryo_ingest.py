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
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from trace_platform.chain.identity import RangeMissing, identity
from trace_platform.chain.rpc import Rpc
from trace_platform.contract import ChainIdentity, EventIn, OutputCommit, RangeSpec, scope_key
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


# Spark splits a Parquet file by row group: ~128k rows a group lets a large range's decode use
# every core or executor (pyarrow's default, 1M rows, makes one task of it).
ROW_GROUP_ROWS = 128 * 1024


def _known_datatype(value: str) -> str:
    if value not in KNOWN_DATATYPES:
        raise ValueError(
            f"unknown datatype '{value}' (known: {', '.join(sorted(KNOWN_DATATYPES))})"
        )
    return value


class CryoIngestConfig(OperatorConfig):
    """One output per datatype, in order."""

    datatypes: list[Annotated[str, AfterValidator(_known_datatype)]] = Field(
        default_factory=lambda: list(DEFAULT_DATATYPES),
        min_length=1,
        max_length=64,
        description="Cryo datatypes, one output each, in order",
    )
    rpc_url: str | None = Field(
        default=None, max_length=2048, description="the node (else the pool slot's `RPC_URL`)"
    )
    network_name: str = Field(
        default="devnet",
        min_length=1,
        max_length=128,
        description="Cryo's network label for the files",
    )
    requests_per_second: int = Field(
        default=200, ge=1, le=1_000_000, description="Cryo's RPC rate limit"
    )
    max_concurrent_requests: int = Field(
        default=4, ge=1, le=1024, description="Cryo's concurrent RPC requests"
    )

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
    with Rpc(rpc) as node:
        chain = range_identity(node, start, end)
        if already_holds(ctx, chain):
            # A backfill's completeness check: every output holds this range, read from the
            # chain the node has now. Nothing to redo, nothing downstream to wake.
            ctx.progress(unchanged=True)
            return OperatorResult()
        result = _ingest(ctx, cfg, rpc, start, end, chain)
        if range_identity(node, start, end) != chain:
            raise OperatorError(
                f"the chain changed under blocks {start}-{end - 1} while they were read (a "
                "reorg); the range is read again"
            )
    return result


def range_identity(node: Rpc, start: int, end: int) -> ChainIdentity:
    try:
        return identity(node, start, end)
    except RangeMissing as e:
        raise OperatorError(f"blocks {start}-{end - 1}: {e} (retrying)") from None


def already_holds(ctx: OperatorContext, chain: ChainIdentity) -> bool:
    """Whether every output already committed this range from exactly this chain."""
    scope = scope_key(None, RangeSpec(**(ctx.task.input_event or {})["range"]))
    held = {
        c.dataset_version: c.chain
        for c in ctx.task.committed
        if c.scope == scope and c.chain is not None
    }
    return bool(ctx.task.outputs) and all(
        held.get(o.dataset_version) == chain for o in ctx.task.outputs
    )


def _check_blocks(table: Any, chain: ChainIdentity, start: int, end: int) -> None:
    """The blocks Cryo wrote are the ones the identity names (else the node moved between)."""
    if table.num_rows == 0 or "block_hash" not in table.column_names:
        return
    rows = table.sort_by("block_number").select(["block_number", "block_hash"]).to_pylist()
    first, last = rows[0], rows[-1]
    if (
        first["block_number"] != start
        or last["block_number"] != end - 1
        or "0x" + first["block_hash"].hex() != chain.first_hash
        or "0x" + last["block_hash"].hex() != chain.last_hash
    ):
        raise OperatorError(
            f"blocks {start}-{end - 1} as read do not match the node's chain now (a reorg); "
            "the range is read again"
        )


def _ingest(
    ctx: OperatorContext,
    cfg: CryoIngestConfig,
    rpc: str,
    start: int,
    end: int,
    chain: ChainIdentity,
) -> OperatorResult:
    import cryo
    import pyarrow.parquet as pq

    store = ctx.store
    result = OperatorResult()
    for datatype, out in zip(cfg.datatypes, ctx.task.outputs, strict=True):
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
            # ParquetFile, not read_table: the same table from one file, without loading the
            # dataset layer (~1 s on a host's first task).
            table = pq.ParquetFile(f).read()
            if datatype == "blocks":
                _check_blocks(table, chain, start, end)
            pq.write_table(table, f, compression="zstd", row_group_size=ROW_GROUP_ROWS)
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
                chain=chain,
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
