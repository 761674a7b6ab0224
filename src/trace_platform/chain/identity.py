"""Which chain a block range belongs to, as the node says now: its chain id, its first block's
hash and parent hash, its last block's hash. Recorded with every raw range commit; compared with
the node again by every completeness check (a mismatch is a reorg, or a chain reset under the
same id)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

from trace_platform.chain.rpc import Rpc, RpcError
from trace_platform.contract import ChainIdentity


class RangeMissing(RpcError):
    """The node has no block where the range needs one (it is behind, or was reset shorter)."""


BATCH = 200  # ranges per JSON-RPC batch (two headers each)


def identities(rpc: Rpc, ranges: Iterable[tuple[int, int]]) -> dict[tuple[int, int], ChainIdentity]:
    """The identity of each half-open range [start, end), a few batch requests in all."""
    spans = [(s, e) for s, e in ranges if e > s]
    chain_id = int(rpc.call("eth_chainId"), 16)
    out: dict[tuple[int, int], ChainIdentity] = {}
    for k in range(0, len(spans), BATCH):
        part = spans[k : k + BATCH]
        calls: list[tuple[str, list[object]]] = []
        for s, e in part:
            calls += [
                ("eth_getBlockByNumber", [hex(s), False]),
                ("eth_getBlockByNumber", [hex(e - 1), False]),
            ]
        replies = rpc.batch(calls)
        for i, (s, e) in enumerate(part):
            first, last = replies[2 * i], replies[2 * i + 1]
            if first is None or last is None:
                raise RangeMissing(f"the node has no block {s if first is None else e - 1}")
            out[(s, e)] = ChainIdentity(
                chain_id=chain_id,
                first_hash=first["hash"].lower(),
                parent_hash=first["parentHash"].lower(),
                last_hash=last["hash"].lower(),
            )
    return out


def identity(rpc: Rpc, start: int, end: int) -> ChainIdentity:
    return identities(rpc, [(start, end)])[(start, end)]


@dataclass(frozen=True)
class Mismatch:
    """A committed range the node no longer agrees with."""

    start: int
    end: int
    committed: ChainIdentity | None  # None: committed before identities were recorded
    node: ChainIdentity | None  # None: the node has no such blocks now

    def describe(self) -> str:
        if self.committed is None:
            return f"blocks {self.start}-{self.end - 1}: committed without block hashes"
        if self.node is None:
            return f"blocks {self.start}-{self.end - 1}: the node no longer has them"
        if self.committed.chain_id != self.node.chain_id:
            return (
                f"blocks {self.start}-{self.end - 1}: chain id {self.committed.chain_id} "
                f"committed, the node is chain {self.node.chain_id}"
            )
        return (
            f"blocks {self.start}-{self.end - 1}: last block hash {self.committed.last_hash[:10]}… "
            f"committed, the node has {self.node.last_hash[:10]}… (reorg or reset chain)"
        )


def mismatches(rpc: Rpc, committed: dict[tuple[int, int], ChainIdentity | None]) -> list[Mismatch]:
    """The committed ranges whose identity the node no longer confirms, in block order."""
    known = {r: c for r, c in committed.items() if c is not None}
    out = [Mismatch(s, e, None, None) for (s, e), c in committed.items() if c is None]
    try:
        node = identities(rpc, known)
    except RangeMissing:
        node = {}
        for r in known:  # one by one: which ranges are gone
            with contextlib.suppress(RangeMissing):
                node[r] = identity(rpc, *r)
    for r, c in known.items():
        if node.get(r) != c:
            out.append(Mismatch(r[0], r[1], c, node.get(r)))
    return sorted(out, key=lambda m: m.start)
