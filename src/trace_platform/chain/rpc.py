"""A small JSON-RPC client for EVM nodes (one call, a batch, eth_call, the head)."""

from __future__ import annotations

import itertools
from typing import Any

import httpx


class RpcError(RuntimeError):
    pass


class Rpc:
    def __init__(self, url: str, timeout: float = 60.0) -> None:
        self.url = url
        self.http = httpx.Client(timeout=timeout)
        self._ids = itertools.count(1)

    def call(self, method: str, *params: Any) -> Any:
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": list(params)}
        r = self.http.post(self.url, json=body).json()
        if "error" in r:
            raise RpcError(f"{method}: {r['error'].get('message', r['error'])}")
        return r["result"]

    def batch(self, calls: list[tuple[str, list[Any]]]) -> list[Any]:
        """Many calls in one HTTP request; results in call order."""
        if not calls:
            return []
        body = [
            {"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(calls)
        ]
        replies = sorted(self.http.post(self.url, json=body).json(), key=lambda r: r["id"])
        for r in replies:
            if "error" in r:
                raise RpcError(f"{calls[r['id']][0]}: {r['error'].get('message', r['error'])}")
        return [r["result"] for r in replies]

    def eth_call(self, to: str, data: str, block: int | str = "latest") -> int:
        tag = hex(block) if isinstance(block, int) else block
        return int(self.call("eth_call", {"to": to, "data": data}, tag), 16)

    def block_number(self) -> int:
        return int(self.call("eth_blockNumber"), 16)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Rpc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
