"""The worker's HTTP transport to the Dispatcher's internal API: one keep-alive urllib3 pool
shared by all of a worker's threads.

Not httpx, which the rest of Trace uses: on the worker's hot path (a claim and a completion per
task) httpx cost about 510 us of CPU per request on this 2-core machine, urllib3 about 160 us
(bench: one loopback request after another, same body, same answer). Every failure below HTTP
(refused, reset, timed out, a dropped keep-alive connection) is a `TransportError`: the
caller's to retry, since every internal call is idempotent or fenced. The API is reached
directly: proxy variables in the environment are not used for it (its requests carry the
internal token), and an https URL is verified as the rest of Trace verifies (certifi's CAs),
or with TRACE_API_CA_BUNDLE's (trace_platform/tls.py)."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlencode, urlsplit

import urllib3
from urllib3.exceptions import HTTPError as _Urllib3Error

from trace_platform.sandbox.gateway import verified_tls


def pool_size(wrappers: int) -> int:
    """Connections kept for a worker of `wrappers` wrappers: each one's thread may have a
    heartbeat or an event and a completion in flight at once, and the loop's exchanges
    besides. A request past them opens a connection of its own (never a wait), which
    urllib3 then closes with a warning."""
    return 2 * wrappers + 4


class TransportError(Exception):
    """The request got no HTTP answer: the API unreachable, the connection lost, a timeout."""


class Response:
    __slots__ = ("content", "status")

    def __init__(self, status: int, content: bytes) -> None:
        self.status = status
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class Transport:
    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        timeout: float,
        connections: int,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """`tls`: what an https API is verified with (default: certifi's CAs)."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
            # Not echoed: it may hold a password.
            raise ValueError("the API URL must be http(s)://host[:port][/path], no credentials")
        self.prefix = parts.path.rstrip("/")  # a path the API is mounted under, if any
        self.headers = headers
        https = {"ssl_context": tls or verified_tls()} if parts.scheme == "https" else {}
        self.pool = urllib3.connection_from_url(
            f"{parts.scheme}://{parts.netloc}",
            maxsize=connections,
            block=False,
            retries=False,  # retried by the caller, which knows what is safe to retry
            timeout=urllib3.Timeout(timeout),
            **https,
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        content: str | bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        url = self.prefix + path + (f"?{urlencode(params)}" if params else "")
        try:
            r = self.pool.urlopen(
                method,
                url,
                body=content.encode() if isinstance(content, str) else content,
                headers={**self.headers, **headers} if headers else self.headers,
                timeout=urllib3.Timeout(timeout) if timeout is not None else self.pool.timeout,
                redirect=False,
                preload_content=True,
            )
        except _Urllib3Error as e:
            raise TransportError(f"{method} {path}: {e}") from e
        return Response(r.status, r.data)

    def close(self) -> None:
        self.pool.close()
