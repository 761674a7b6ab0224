"""Which node and token to verify against: the flags, else the running devnet (`trace devnet
up`), else the last demo run's plan (TRACE_HOME/demo/last.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from trace_platform.chain import Rpc, RpcError
from trace_platform.verify.model import CannotVerify


class TargetError(CannotVerify):
    """No node to verify against, or it does not answer: the message says what to do."""


@dataclass(frozen=True)
class Target:
    rpc_url: str
    token: str | None
    source: str  # where rpc_url came from, for the header and the errors


def _last_plan(home: Path) -> dict[str, Any]:
    path = home / "demo" / "last.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _devnet(home: Path) -> tuple[str, str | None] | None:
    from trace_platform.devnet import Devnet

    devnet = Devnet(home)
    info = devnet.node.info()
    if info is None or not devnet.node.running():
        return None
    chain = devnet.chain()
    return info.url, chain.token if chain else None


def resolve_target(home: Path, rpc_url: str | None, token: str | None) -> Target:
    plan = _last_plan(home)
    devnet = _devnet(home) if rpc_url is None else None
    if rpc_url is not None:
        url, source = rpc_url, "--rpc-url"
    elif devnet is not None:
        url, source = devnet[0], "the running devnet"
    elif plan.get("rpc_url"):
        url, source = str(plan["rpc_url"]), f"the last demo run ({home / 'demo' / 'last.json'})"
    else:
        raise TargetError(
            "no node to verify against: pass --rpc-url URL, start the devnet (trace devnet up), "
            "or run trace demo first"
        )
    # The token the last demo analysed; else, verifying the devnet, the devnet's own token.
    token = token or plan.get("token") or (devnet[1] if devnet else None)
    return Target(url, token.lower() if token else None, source)


def connect(target: Target) -> Rpc:
    """An Rpc to the target, once it has answered."""
    rpc = Rpc(target.rpc_url, timeout=30)
    try:
        rpc.block_number()
    except (httpx.HTTPError, RpcError, ValueError) as e:
        rpc.close()
        raise TargetError(
            f"no node answers at {target.rpc_url} (from {target.source}): {e}. Start it "
            "(trace devnet up) or pass --rpc-url URL of a node of the chain Trace synced"
        ) from None
    return rpc
