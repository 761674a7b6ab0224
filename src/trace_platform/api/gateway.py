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

from trace_platform.api.errors import answer_unless_started, error_response, shorten
from trace_platform.dag.schema import NAME
from trace_platform.errors import Invalid
from trace_platform.identity.vault import SECRET_NAME

MAX_BODY_BYTES = 2 * 1024 * 1024
MAX_JSON_DEPTH = 64
TOO_DEEP = f"the JSON body is nested deeper than the limit of {MAX_JSON_DEPTH} levels"


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

        # The routes' own reads are answered by the 413 handler (BodyTooLarge is an
        # HTTPException); this answers a read outside them.
        await answer_unless_started(
            self.app,
            scope,
            counted,
            send,
            BodyTooLarge,
            lambda _: error_response(413, "too_large", BodyTooLarge(limit).detail),
        )


class InternalToken:
    """`/internal/*` without the platform's internal token is refused before its body is read.
    The only check of the token: a route dependency would run after FastAPI has read, parsed
    and validated the body (answering a 422 to anyone). The path is the one the router
    matches, without any `root_path` the server was given."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _route_path(scope).startswith("/internal/"):
            given = next((v for k, v in scope["headers"] if k == b"x-internal-token"), None)
            if given is None or not secrets.compare_digest(given, self.token):
                response = error_response(
                    401, "unauthorized", "internal endpoints need the platform's internal token"
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The path as Starlette's router matches it: `path` without a leading `root_path`."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :]
    return path


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


def _check_depth(value: Any) -> None:
    """No container deeper than MAX_JSON_DEPTH: one level at a time, containers only (the
    walk runs for any body with more brackets than the limit, e.g. 1,000 events)."""
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(MAX_JSON_DEPTH):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return
    raise RequestRejected(TOO_DEEP)


def _check_strings(value: Any, *, surrogates: bool) -> None:
    """No NUL (Postgres stores it neither in text nor in jsonb) and, if `surrogates`, no lone
    surrogate in any string or key. Iterative: the tree may be deep."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            if "\x00" in node:
                raise RequestRejected("NUL characters (\\u0000) are not allowed in the body")
            if surrogates and _lone_surrogate(node):
                raise RequestRejected(
                    "lone surrogates (\\ud800-\\udfff) are not allowed in the body"
                )


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
        raise RequestRejected(TOO_DEEP) from None
    except ValueError as e:  # not UTF-8, NaN/Infinity, 1e999, an int of over 4300 digits
        raise json.JSONDecodeError(shorten(str(e), 200), "", 0) from None
    # Each walk runs only when it can find something: more brackets than the depth limit, or
    # an escape that decodes to a NUL or a surrogate.
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH:
        _check_depth(value)
    surrogates = _SURROGATE_ESCAPE.search(body) is not None
    if surrogates or b"\\u0000" in body:
        _check_strings(value, surrogates=surrogates)
    return value


class TraceRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


# -- path, query and headers -----------------------------------------------------------------
# (what it names, its rule): the rules of the names the path parameters stand for.
Rule = tuple[str, re.Pattern[str]]


def path_rule(path: str, param: str) -> Rule | None:
    """The rule of a path parameter that is a name, by the route's path."""
    if param == "name" and path.startswith("/v1/secrets/"):
        return "secret name", SECRET_NAME
    if param == "name" and path.startswith("/v1/datasets/"):
        return "dataset name", NAME
    if param == "name" and path.startswith("/v1/destinations/"):
        return "destination name", NAME
    if param in ("name", "dag") and path.startswith(("/v1/dags/", "/v1/hooks/")):
        return "DAG name", NAME
    if param == "trigger":
        return "trigger name", NAME
    return None


def check_request(request: Request, rules: dict[str, Rule]) -> None:
    """NULs nowhere (path, query, headers); names in the path that follow their rule (`fullmatch`:
    a trailing newline does not slip past `$`). Refused as the control plane refuses a bad name:
    422 `invalid`, naming the rule."""
    for param, value in request.path_params.items():
        if not isinstance(value, str):
            continue
        rule = rules.get(param)
        if "\x00" in value or (rule is not None and not rule[1].fullmatch(value)):
            what, shown = (
                (rule[0], rule[1].pattern)
                if rule
                else (f"path parameter {param}", "no NUL characters")
            )
            raise Invalid(f"{what} {shorten(repr(value), 100)} must match {shown}", rule=shown)
    for key, value in request.query_params.multi_items():
        if "\x00" in key or "\x00" in value:
            raise Invalid(f"query parameter {shorten(repr(key), 100)} holds a NUL character")
    for key, value in request.scope["headers"]:
        if b"\x00" in value:
            raise nul_header(key.decode("latin-1"))


def nul_header(name: str) -> Invalid:
    """The refusal of a header whose value holds a NUL (the API's and the exchange
    listener's)."""
    return Invalid(f"header {shorten(repr(name), 100)} holds a NUL")


class TraceRoute(APIRoute):
    """Every route: the checks above, and request bodies parsed by `parse_json`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        rules = {
            param: rule
            for param in self.param_convertors
            if (rule := path_rule(self.path_format, param)) is not None
        }

        async def route_handler(request: Request) -> Response:
            check_request(request, rules)
            return await handler(TraceRequest(request.scope, request.receive))

        return route_handler
