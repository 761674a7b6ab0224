"""API Gateway -> the Gateway's named webhook, `POST /v1/hooks/{dag}/{trigger}`.

Deploy as the handler `trace_platform.aws.apigateway.handler` behind a REST API (proxy
integration, payload format 1.0) or an HTTP API (payload format 1.0 or 2.0), on the route
`POST /v1/hooks/{dag}/{trigger}` (docs/aws-entry.md). The event becomes the HTTP request it
stands for and is served by the Gateway's own webhook route (api/app.py `create_hooks_app`):
the same API key or bearer, Idempotency-Key header, body bound, JSON checks, status codes and
error shapes as the Lite Gateway. Only an event no request could make is answered here: 400
(not an API Gateway event, no method, headers that are not text, a body that is not text or
not the base64 it claims to be) or 404 (no `dag` and `trigger` in the route), in the same
error shape, with nothing stored."""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from typing import Any
from urllib.parse import quote, unquote, urlencode

from fastapi import FastAPI
from starlette.types import Message

from trace_platform.api.app import create_hooks_app
from trace_platform.api.errors import error_response, shorten
from trace_platform.aws import container
from trace_platform.services import Services

ROUTE = "/v1/hooks/{dag}/{trigger}"
# A catch-all route ({proxy+}, $default) names no parameters: the path then ends in the hook's.
_HOOK_PATH = re.compile(r"(?:^|/)hooks/([^/]+)/([^/]+)/?$")
# Set by the adapter from the decoded body (a client's may count base64 or be absent).
_FRAMING = frozenset({"content-length", "transfer-encoding"})


class BadEvent(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


_app: tuple[Services, FastAPI] | None = None


def _hooks_app() -> FastAPI:
    """The webhook app over this container's Services (rebuilt only if they change)."""
    global _app
    services = container.services()
    if _app is None or _app[0] is not services:
        _app = (services, create_hooks_app(services))
    return _app[1]


def handler(event: Any, context: Any) -> dict[str, Any]:
    """An API Gateway proxy response: {statusCode, headers, body, isBase64Encoded}."""
    try:
        scope, body = request(event)
    except BadEvent as e:
        answer = error_response(e.status, e.code, shorten(e.message))
        return _proxy(answer.status_code, answer.raw_headers, bytes(answer.body))
    return _proxy(*asyncio.run(serve(_hooks_app(), scope, body)))


def request(event: Any) -> tuple[dict[str, Any], bytes]:
    """The ASGI scope and body of the request an API Gateway event stands for."""
    if not isinstance(event, dict):
        raise BadEvent(400, "bad_request", "the event is not an API Gateway proxy event")
    v2 = event.get("version") == "2.0"
    if not v2 and "httpMethod" not in event:
        raise BadEvent(
            400,
            "bad_request",
            'not an API Gateway proxy event: neither payload format 2.0 (version "2.0") '
            "nor 1.0 (httpMethod)",
        )
    context = event.get("requestContext") or {}
    if not isinstance(context, dict):
        raise BadEvent(400, "bad_request", "requestContext is not an object")
    http = context.get("http") if v2 else None
    method = http.get("method") if isinstance(http, dict) else event.get("httpMethod")
    if not isinstance(method, str) or not method:
        where = "requestContext.http.method" if v2 else "httpMethod"
        raise BadEvent(400, "bad_request", f"the event has no HTTP method ({where})")
    path = _path(event, v2)
    headers = _headers(event, v2)
    if isinstance(context.get("requestId"), str):  # the Gateway's own id, for the audit log
        headers = [h for h in headers if h[0] != b"x-request-id"]
        headers.append((b"x-request-id", context["requestId"].encode("latin-1", "replace")))
    body = _body(event)
    headers.append((b"content-length", str(len(body)).encode()))
    source = (http if v2 else context.get("identity")) or {}
    ip = source.get("sourceIp") if isinstance(source, dict) else None
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method.upper(),
        "scheme": "https",
        "path": path,
        "raw_path": quote(path).encode(),
        "root_path": "",
        "query_string": _query(event, v2),
        "headers": headers,
        "client": (ip, 0) if isinstance(ip, str) else None,
        "server": None,
    }
    return scope, body


def _path(event: dict[str, Any], v2: bool) -> str:
    """The hook's path, from the route's `dag` and `trigger` parameters, else from a catch-all
    route's path."""
    params = event.get("pathParameters") or {}
    if isinstance(params, dict) and isinstance(params.get("dag"), str):
        dag, trigger = params.get("dag"), params.get("trigger")
        if isinstance(trigger, str):
            return ROUTE.format(dag=dag, trigger=trigger)
    raw = event.get("rawPath" if v2 else "path")
    found = _HOOK_PATH.search(unquote(raw)) if isinstance(raw, str) else None
    if found is None:
        shown = shorten(repr(raw), 100) if raw is not None else "none"
        raise BadEvent(
            404,
            "not_found",
            f"this function serves only {ROUTE}: the event has no dag and trigger path "
            f"parameters, and its path ({shown}) is not a hook's",
        )
    return ROUTE.format(dag=found[1], trigger=found[2])


def _headers(event: dict[str, Any], v2: bool) -> list[tuple[bytes, bytes]]:
    """Lowercased names; every value of a repeated header (format 1.0's multiValueHeaders;
    2.0 has joined them with commas already)."""
    multi = None if v2 else event.get("multiValueHeaders")
    given = multi if isinstance(multi, dict) and multi else event.get("headers")
    if given is None:
        return []
    if not isinstance(given, dict):
        raise BadEvent(400, "bad_request", "the event's headers are not an object")
    out = []
    for name, values in given.items():
        for value in values if isinstance(values, list) else [values]:
            if not isinstance(name, str) or not isinstance(value, str):
                raise BadEvent(400, "bad_request", f"header {shorten(repr(name), 100)} is not text")
            if name.lower() not in _FRAMING:
                out.append((name.lower().encode(), value.encode()))
    return out


def _body(event: dict[str, Any]) -> bytes:
    body = event.get("body")
    if body is None:
        return b""
    if not isinstance(body, str):
        raise BadEvent(400, "bad_request", "the event's body is not text")
    if event.get("isBase64Encoded") is True:
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError) as e:
            raise BadEvent(
                400, "bad_request", f"the body is marked isBase64Encoded but is not base64 ({e})"
            ) from None
    return body.encode()


def _query(event: dict[str, Any], v2: bool) -> bytes:
    if v2:
        raw = event.get("rawQueryString")
        return raw.encode() if isinstance(raw, str) else b""
    given = event.get("multiValueQueryStringParameters") or event.get("queryStringParameters")
    if not isinstance(given, dict):
        return b""
    return urlencode(given, doseq=True).encode()


async def serve(
    app: FastAPI, scope: dict[str, Any], body: bytes
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Runs the app on one request: its status, headers and body."""
    done = asyncio.Event()
    sent = False
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # the client stays connected until the answer is complete
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    try:
        await app(scope, receive, send)
    finally:
        done.set()
    return int(start.get("status", 500)), list(start.get("headers", [])), b"".join(chunks)


def _proxy(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any]:
    """An API Gateway proxy response (both payload formats read this shape)."""
    joined: dict[str, str] = {}
    for name, value in headers:
        key, text = name.decode("latin-1"), value.decode("latin-1")
        joined[key] = f"{joined[key]}, {text}" if key in joined else text
    try:
        return {
            "statusCode": status,
            "headers": joined,
            "body": body.decode(),
            "isBase64Encoded": False,
        }
    except UnicodeDecodeError:
        return {
            "statusCode": status,
            "headers": joined,
            "body": base64.b64encode(body).decode(),
            "isBase64Encoded": True,
        }
