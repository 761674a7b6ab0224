"""What the demo syncs: the chain, the block range, range and window sizes; and the last run's
plan, kept under TRACE_HOME so a later run keeps the range boundaries its data was synced with."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class DemoPlan:
    rpc_url: str
    token: str
    from_block: int
    to_block: int
    chunk_size: int
    network: str
    window_blocks: int  # staking concentration windows
    hot_blocks: int
    # Cryo's RPC rate limit: the DAG file's (200, polite to a shared node) for a chain the user
    # names; the devnet is the demo's own node, where 200/s was three quarters of the sync.
    requests_per_second: int = 200

    @property
    def ranges(self) -> int:
        from trace_platform.operators.ranges import split

        return len(split(self.from_block, self.to_block, self.chunk_size))


def last_run(state_file: Path) -> dict[str, Any] | None:
    """The plan the last run completed with, if any."""
    return json.loads(state_file.read_text()) if state_file.exists() else None


def save_run(state_file: Path, plan: DemoPlan) -> None:
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.write_text(json.dumps(asdict(plan), indent=2))


def keep_boundaries(
    plan: DemoPlan, previous: dict[str, Any] | None, chunk_size: int | None
) -> str | None:
    """Same chain, same dataset versions: other range boundaries would add overlapping range
    commits (rows twice), so keep the boundaries the data was synced with. Returns why not."""
    if not previous or previous.get("network") != plan.network:
        return None
    if chunk_size is None:
        plan.chunk_size = int(previous["chunk_size"])
    elif chunk_size != previous["chunk_size"]:
        return (
            f"this chain was synced in ranges of {previous['chunk_size']}; "
            f"ranges of {chunk_size} would overlap them in the same dataset versions. Use "
            f"--chunk-size {previous['chunk_size']}, or another TRACE_HOME."
        )
    return None


# Cryo's own pace against a local anvil (a 500-block range: 15 s at 200/s, ~1 s unlimited).
DEVNET_REQUESTS_PER_SECOND = 5000


def devnet_plan(
    a: int | None, b: int | None, chunk: int, previous: dict[str, Any] | None, spec: Any
) -> DemoPlan:
    """The devnet's plan (`spec`: its ChainSpec); its token is the last run's (`previous`), else
    the first deployment."""
    return DemoPlan(
        rpc_url="http://127.0.0.1:8545",
        token=(previous or {}).get("token", "0x5fbdb2315678afecb367f032d93f642f64180aa3"),
        from_block=a if a is not None else 0,
        to_block=b if b is not None else spec.blocks - 1,
        chunk_size=chunk,
        network="devnet",
        window_blocks=spec.epoch_blocks,
        hot_blocks=500,
        requests_per_second=DEVNET_REQUESTS_PER_SECOND,
    )


def chain_plan(url: str, token: str, a: int, b: int, chunk: int) -> DemoPlan:
    from trace_platform.chain import Rpc

    rpc = Rpc(url)
    try:
        chain_id = int(rpc.call("eth_chainId"), 16)
    finally:
        rpc.close()
    span = b - a + 1
    return DemoPlan(
        rpc_url=url,
        token=token.lower(),
        from_block=a,
        to_block=b,
        chunk_size=chunk,
        network=f"chain{chain_id}",
        window_blocks=max(10, span // 20),
        hot_blocks=min(10_000, max(100, span // 4)),
    )
