"""Talking to an EVM chain: the JSON-RPC client and the ABI/keccak helpers.

Production operators (`operators/ranges.py`'s chain tip, `operators/decode.py`'s topics) and
the devnet use the same pieces from here."""

from trace_platform.chain.abi import calldata, keccak256, selector, topic0, word
from trace_platform.chain.rpc import Rpc, RpcError

__all__ = ["Rpc", "RpcError", "calldata", "keccak256", "selector", "topic0", "word"]
