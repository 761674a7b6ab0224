"""The worker's HTTP transport to the Dispatcher's internal API: one keep-alive urllib3 pool
shared by all of a worker's threads.

Not httpx, which the rest of Trace uses: on the worker's hot path (a claim and a completion per
task) httpx cost about 510 us of CPU per request on this 2-core machine, urllib3 about 160 us
(bench: one loopback request after another, same body, same answer). Every failure below HTTP
(refused, reset, timed out, a dropped keep-alive connection) is a `TransportError`: the
caller's to retry, since every internal call is idempotent or fenced."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode, urlsplit

import urllib3
from urllib3.exceptions import HTTPError as _Urllib3Error

# Connections kept per worker: its wrapper threads' heartbeats and events, the claim and
# completion batches and the report threads each hold one while a request is in flight. More
# are opened when needed and closed after (never a wait for one).
POOL_SIZE = 32


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
    def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the API URL must be http(s)://host[:port][/path]: {base_url!r}")
        self.prefix = parts.path.rstrip("/")  # a path the API is mounted under, if any
        self.headers = headers
        self.timeout = timeout
        self.pool = urllib3.connection_from_url(
            f"{parts.scheme}://{parts.netloc}",
            maxsize=POOL_SIZE,
            block=False,
            retries=False,  # retried by the caller, which knows what is safe to retry
            timeout=urllib3.Timeout(timeout),
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
