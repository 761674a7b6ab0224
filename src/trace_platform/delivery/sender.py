"""One webhook attempt: the address checked now, the body sent to exactly that address with
its Standard Webhooks headers, no redirect followed, and what happened (to record)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from trace_platform.delivery import safety, signing

# 4xx a retry can fix; any other 4xx is the receiver saying no for good.
RETRYABLE_4XX = frozenset({408, 409, 425, 429})


@dataclass(frozen=True)
class Outcome:
    outcome: str  # delivered | retry | failed | refused
    status_code: int | None = None
    latency_ms: int | None = None
    error: str | None = None
    address: str | None = None
    retry_after: float | None = None  # seconds, from the receiver's Retry-After


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class Sender:
    def __init__(self, *, timeout: float, platform_ports: set[int] | None = None) -> None:
        self.platform_ports = frozenset(platform_ports or ())
        # No redirects, no proxies from the environment, no cookies kept between receivers.
        self.client = httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False)

    def close(self) -> None:
        self.client.close()

    def send(
        self, *, url: str, allow_private: bool, secret: str, msg_id: str, body: str
    ) -> Outcome:
        try:
            target = safety.resolve(
                url, allow_private=allow_private, platform_ports=set(self.platform_ports)
            )
        except safety.Refused as e:
            return Outcome("refused", error=str(e))
        headers = {**signing.headers(secret, msg_id, body), "host": _host_header(target)}
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        started = time.monotonic()
        try:
            r = self.client.post(
                target.url, content=body.encode(), headers=headers, extensions=extensions
            )
        except httpx.HTTPError as e:
            return Outcome(
                "retry",
                latency_ms=int((time.monotonic() - started) * 1000),
                error=f"{type(e).__name__}: {e}"[:1000],
                address=target.address,
            )
        ms = int((time.monotonic() - started) * 1000)
        code = r.status_code
        if 200 <= code < 300:
            return Outcome("delivered", code, ms, address=target.address)
        if 300 <= code < 400:
            where = r.headers.get("location", "")
            return Outcome(
                "failed",
                code,
                ms,
                error=f"redirect to {where[:200]!r} refused: redirects are never followed",
                address=target.address,
            )
        text = r.text[:300]
        if code >= 500 or code in RETRYABLE_4XX:
            return Outcome(
                "retry",
                code,
                ms,
                error=f"HTTP {code}: {text}",
                address=target.address,
                retry_after=retry_after(r.headers.get("retry-after")),
            )
        return Outcome("failed", code, ms, error=f"HTTP {code}: {text}", address=target.address)


def _host_header(t: safety.Target) -> str:
    default = 443 if t.scheme == "https" else 80
    host = f"[{t.host}]" if ":" in t.host else t.host
    return host if t.port == default else f"{host}:{t.port}"
