"""Fenced calls on the wire: the lease reference in the query string and the X-Lease-Token
header, the rest of the call as the JSON body (see `trace_platform.contract.LeaseRef`)."""

from __future__ import annotations

from typing import Any

_REF = ("task_id", "attempt", "lease_token")


def fenced(call: dict[str, Any]) -> dict[str, Any]:
    """httpx keyword arguments for a fenced call given as one dict (lease fields and body)."""
    kw: dict[str, Any] = {
        "json": {k: v for k, v in call.items() if k not in _REF},
        "params": {k: str(call[k]) for k in ("task_id", "attempt") if k in call},
    }
    if "lease_token" in call:
        kw["headers"] = {"X-Lease-Token": str(call["lease_token"])}
    return kw
