"""The node's own answers: uint256 views (`totalSupply()`, `balanceOf()`, `validatorStake()`)
at a block, batched so a remote RPC costs one request per few dozen values."""

from __future__ import annotations

from trace_platform.chain import Rpc, RpcError

BATCH = 50  # calls per JSON-RPC batch: small enough for public endpoints' batch limits


class Node:
    def __init__(self, rpc: Rpc) -> None:
        self.rpc = rpc

    def views(self, calls: list[tuple[str, str, int]]) -> list[int | None]:
        """(contract, calldata, block) -> the uint the view returns there; None where the
        contract has no code at that block (a token before its deployment answers "0x")."""
        out: list[int | None] = []
        for i in range(0, len(calls), BATCH):
            chunk = calls[i : i + BATCH]
            replies = self.rpc.batch(
                [("eth_call", [{"to": to, "data": data}, hex(block)]) for to, data, block in chunk]
            )
            out.extend(_uint(r) for r in replies)
        return out

    def view(self, to: str, data: str, block: int) -> int | None:
        return self.views([(to, data, block)])[0]

    def has_view(self, to: str, data: str, block: int) -> bool:
        """Whether `to` answers the view `data` calls at `block` (a contract without it
        reverts; an address without code answers nothing)."""
        try:
            return self.view(to, data, block) is not None
        except RpcError:
            return False

    def head(self) -> int:
        return self.rpc.block_number()


def _uint(reply: str) -> int | None:
    return None if reply in ("0x", "") else int(reply[:66], 16)
