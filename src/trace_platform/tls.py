"""TLS between workers and the API (docs/tls.md): the servers' certificate (the API under
uvicorn, and its exchange listener), the CAs the workers trust, and the refusal of a plain-http
API URL that leaves the host (lease tokens and the internal token would cross it in clear)."""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trace_platform.config import Settings


def server_context(settings: Settings) -> ssl.SSLContext | None:
    """The servers' TLS context (TLS 1.2 or later), or None when no certificate is set. Loaded
    here, at start, so a missing or mismatched file stops the API naming it."""
    if settings.api_tls_cert is None or settings.api_tls_key is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(settings.api_tls_cert, settings.api_tls_key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(
            f"TRACE_API_TLS_CERT={settings.api_tls_cert} / TRACE_API_TLS_KEY="
            f"{settings.api_tls_key}: cannot load them ({e})"
        ) from None
    return ctx


def uvicorn_tls(settings: Settings) -> dict[str, Any]:
    """uvicorn.Config's TLS arguments (none without a certificate)."""
    if server_context(settings) is None:  # checks the files first
        return {}
    return {
        "ssl_certfile": str(settings.api_tls_cert),
        "ssl_keyfile": str(settings.api_tls_key),
    }


def client_context(ca_bundle: Path | None) -> ssl.SSLContext:
    """What a worker verifies the API with: the CAs of `ca_bundle` (PEM) alone when given,
    else certifi's. Hostnames are always checked. Without a bundle the context is the process's
    shared one (verified_tls): read it, never change it."""
    if ca_bundle is None:
        from trace_platform.sandbox.gateway import verified_tls

        return verified_tls()
    try:
        return ssl.create_default_context(cafile=str(ca_bundle))
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"TRACE_API_CA_BUNDLE={ca_bundle}: cannot load it ({e})") from None


def loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_worker_url(url: str, settings: Settings, what: str) -> None:
    """Refuses a plain-http `url` (the API's, or its exchange listener's) that is not on this
    host, unless TRACE_API_INSECURE_HTTP says the network between them is private."""
    parts = urlsplit(url)
    if parts.scheme != "http" or settings.api_insecure_http:
        return
    if not loopback(parts.hostname or ""):
        raise ValueError(
            f"{what} {parts.scheme}://{parts.hostname}: plain http to another host would send "
            "the internal token and lease tokens in clear. Serve the API over https "
            "(TRACE_API_TLS_CERT/TRACE_API_TLS_KEY, docs/tls.md), or set "
            "TRACE_API_INSECURE_HTTP=true on a private network"
        )


def worker_tls(settings: Settings, url: str, exchange: str | None = None) -> ssl.SSLContext:
    """What a process that claims tasks (a worker, the Lambda invoker) verifies the API with,
    once its URLs are checked: a ValueError names a plain-http URL to another host."""
    check_worker_url(url, settings, "the API URL")
    if exchange:
        check_worker_url(exchange, settings, "the exchange URL (TRACE_EXCHANGE_URL)")
    return client_context(settings.api_ca_bundle)
