"""Compatibility: the JSON-RPC client and ABI helpers live in `trace_platform.chain`."""

from trace_platform.chain import Rpc, RpcError, calldata, keccak256, selector, topic0, word

__all__ = ["Rpc", "RpcError", "calldata", "keccak256", "selector", "topic0", "word"]
