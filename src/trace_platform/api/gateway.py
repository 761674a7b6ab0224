"""What the gateway checks before a route sees a request: body size (counted as it streams),
JSON that is well-formed, finite, NUL-free and at most MAX_JSON_DEPTH deep, and path
parameters that follow the rule of the names they stand for."""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trace_platform.api.errors import error_response, shorten
from trace_platform.dag.schema import NAME
from trace_platform.errors import Invalid
from trace_platform.identity.vault import SECRET_NAME

MAX_BODY_BYTES = 2 * 1024 * 1024
MAX_JSON_DEPTH = 64


class BodyTooLarge(HTTPException):
    """Raised from `receive` once more than the limit has streamed in. An HTTPException, so
    FastAPI lets it through its body parsing and the 413 handler answers in Trace's shape."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is over the limit of {limit} bytes")


class RequestRejected(HTTPException):
    """A request the gateway refuses before any route logic runs (422, Trace's shape)."""

    def __init__(self, message: str) -> None:
        super().__init__(422, message)


def _too_large(size: int, limit: int) -> Any:
    return error_response(413, "too_large", f"request body is {size} bytes; the limit is {limit}")


class BodyLimit:
    """Refuses bodies over `max_bytes` (a pure ASGI middleware: Starlette's BaseHTTPMiddleware
    costs about a millisecond per request here). A Content-Length over the limit is answered
    at once, unread; otherwise the bytes of `http.request` messages are counted as the app
    reads them, whatever Content-Length said (chunked bodies included), and reading stops with
    a 413 as soon as the count passes the limit: nothing beyond it is buffered."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await _too_large(int(value), limit)(scope, receive, send)
                return

        received = 0
        over = False
        started = False

        async def counted() -> Message:
            nonlocal received, over
            if over:  # the app asked again after the refusal: read nothing more
                raise BodyTooLarge(limit)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    raise BodyTooLarge(limit)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge as exc:  # read outside the routes' exception handling
            if started:
                raise
            await error_response(413, "too_large", str(exc.detail))(scope, receive, send)


class InternalToken:
    """`/internal/*` without the platform's internal token is refused before its body is read
    (the routes' own dependency checks it again)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/internal/"):
            given = next((v for k, v in scope["headers"] if k == b"x-internal-token"), None)
            if given is None or not secrets.compare_digest(given, self.token):
                response = error_response(
                    401, "unauthorized", "internal endpoints need the platform's internal token"
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# -- JSON bodies -----------------------------------------------------------------------------
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {shorten(text, 40)} is out of range")
    return value


# A `\uD800`-`\uDFFF` escape: half of a surrogate pair, or a lone one no encoder accepts.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_tree(value: Any, *, surrogates: bool) -> None:
    """No container deeper than MAX_JSON_DEPTH, no NUL (Postgres stores it neither in text nor
    in jsonb) and, if `surrogates`, no lone surrogate in any string or key. Iterative: the tree
    may be deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                raise RequestRejected("NUL characters (\\u0000) are not allowed in the body")
            if surrogates and _lone_surrogate(node):
                raise RequestRejected(
                    "lone surrogates (\\ud800-\\udfff) are not allowed in the body"
                )
            continue
        if not isinstance(node, dict | list):
            continue
        if depth > MAX_JSON_DEPTH:
            raise RequestRejected(
                f"the JSON body is nested deeper than the limit of {MAX_JSON_DEPTH} levels"
            )
        if isinstance(node, dict):
            stack.extend((k, depth) for k in node)
            stack.extend((v, depth + 1) for v in node.values())
        else:
            stack.extend((v, depth + 1) for v in node)


def parse_json(body: bytes) -> Any:
    """`json.loads` for request bodies: 422 for a body nested deeper than MAX_JSON_DEPTH (or so
    deep the parser runs out of stack), NaN/Infinity, numbers out of range, NULs and lone
    surrogates; any other decoding problem is a JSONDecodeError, which FastAPI turns into a
    validation error."""
    try:
        value = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise RequestRejected(
            f"the JSON body is nested deeper than the limit of {MAX_JSON_DEPTH} levels"
        ) from None
    except ValueError as e:  # not UTF-8, NaN/Infinity, 1e999, an int of over 4300 digits
        raise json.JSONDecodeError(shorten(str(e), 200), "", 0) from None
    # The walk runs only when it can find something: more brackets than the depth limit, or
    # an escape that decodes to a NUL or a surrogate.
    surrogates = _SURROGATE_ESCAPE.search(body) is not None
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH or b"\\u0000" in body or surrogates:
        _check_tree(value, surrogates=surrogates)
    return value


class TraceRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


# -- path, query and headers -----------------------------------------------------------------
NAME_RULE = "^[a-z][a-z0-9_]{0,127}$"


def path_rule(path: str, param: str) -> tuple[str, re.Pattern[str], str] | None:
    """(what it names, its rule, the rule shown) for a path parameter that is a name."""
    if param == "name" and path.startswith("/v1/secrets/"):
        return "secret name", SECRET_NAME, "^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"
    if param == "name" and path.startswith("/v1/datasets/"):
        return "dataset name", NAME, NAME_RULE
    if param in ("name", "dag") and path.startswith(("/v1/dags/", "/v1/hooks/")):
        return "DAG name", NAME, NAME_RULE
    if param == "trigger":
        return "trigger name", NAME, NAME_RULE
    return None


def check_request(request: Request, path: str) -> None:
    """NULs nowhere (path, query, headers); names in the path that follow their rule (`fullmatch`:
    a trailing newline does not slip past `$`). Refused as the control plane refuses a bad name:
    422 `invalid`, naming the rule."""
    for param, value in request.path_params.items():
        if not isinstance(value, str):
            continue
        rule = path_rule(path, param)
        if "\x00" in value or (rule is not None and not rule[1].fullmatch(value)):
            what, _, shown = rule or (f"path parameter {param}", None, "no NUL characters")
            raise Invalid(f"{what} {shorten(repr(value), 100)} must match {shown}", rule=shown)
    for key, value in request.query_params.multi_items():
        if "\x00" in key or "\x00" in value:
            raise Invalid(f"query parameter {shorten(repr(key), 100)} holds a NUL character")
    for key, value in request.scope["headers"]:
        if b"\x00" in value:
            raise Invalid(f"header {shorten(repr(key.decode('latin-1')), 100)} holds a NUL")


class TraceRoute(APIRoute):
    """Every route: the checks above, and request bodies parsed by `parse_json`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        path = self.path_format

        async def route_handler(request: Request) -> Response:
            check_request(request, path)
            return await handler(TraceRequest(request.scope, request.receive))

        return route_handler
