"""Trace's error shape for every error the API answers: `{"error", "message", "detail"}`.

FastAPI and Starlette answer some errors themselves (validation, unknown routes, wrong methods,
unreadable bodies) in their own shape; the handlers here map each of them, and a last-resort
middleware turns anything unexpected into a logged 500 that shows no internals."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trace_platform.dag.validate import DagInvalid
from trace_platform.errors import TraceError

log = logging.getLogger("trace_platform.api")

# At most this many validation problems are listed, each cut to this many characters: a body
# with 100,000 wrong items (or a 1 MB unknown key) must not produce a 10 MB error.
MAX_PROBLEMS = 20
MAX_PROBLEM_CHARS = 300

# Codes for the statuses FastAPI/Starlette raise themselves; anything else is `http_<status>`.
HTTP_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    411: "length_required",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
}


def error_response(
    status: int,
    code: str,
    message: str,
    detail: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": code, "message": message, "detail": detail or {}}
    return JSONResponse(jsonable_encoder(body), status_code=status, headers=headers)


def shorten(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_validation(exc: RequestValidationError) -> tuple[str, list[str]]:
    """`where: what` for each problem (the first MAX_PROBLEMS), and the joined message."""
    errors = list(exc.errors())
    problems = []
    for e in errors[:MAX_PROBLEMS]:
        where = ".".join(shorten(str(p), 80) for p in e.get("loc", ()))
        what = str(e.get("msg", "invalid"))
        if e.get("type") == "json_invalid":  # FastAPI's own JSON decode error
            loc = list(e.get("loc", ()))
            reason = (e.get("ctx") or {}).get("error") or "not JSON"
            at = f" at position {loc[1]}" if len(loc) > 1 else ""
            where, what = "body", f"invalid JSON{at}: {reason}"
        problems.append(shorten(f"{where}: {what}"))
    if len(errors) > MAX_PROBLEMS:
        problems.append(f"… and {len(errors) - MAX_PROBLEMS} more problems")
    return "; ".join(problems), problems


def http_error_response(
    status: int, detail: Any, method: str, path: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """An HTTP-level refusal (an unknown route, a wrong method, an unreadable or oversized
    body) in Trace's shape, its message the detail given, else one naming the request."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    message = detail if isinstance(detail, str) and detail else phrase
    path = shorten(path, 200)
    if status == 404 and message == phrase:
        message = f"no endpoint {method} {path}"
    elif status == 405 and message == phrase:
        message = f"{method} is not allowed on {path}"
    elif status == 400 and message == "There was an error parsing the body":
        message = "the request body could not be read as JSON"
    return error_response(
        status, HTTP_CODES.get(status, f"http_{status}"), shorten(message), headers=headers
    )


def known_error(exc: BaseException, method: str, path: str) -> JSONResponse | None:
    """The answer to an error a client's input causes, the same from every route (and from
    the workers' exchange listener); None for anything else, which is a logged 500."""
    if isinstance(exc, DagInvalid):  # a TraceError: first, for every problem at once
        problems = [shorten(p.render(exc.source)) for p in exc.problems[: MAX_PROBLEMS + 1]]
        return error_response(422, "invalid_dag", "; ".join(problems), {"problems": problems})
    if isinstance(exc, TraceError):
        return error_response(exc.status_code, exc.code, exc.message, exc.detail)
    if isinstance(exc, RequestValidationError):
        message, problems = describe_validation(exc)
        return error_response(422, "invalid_request", message, {"errors": problems})
    if isinstance(exc, StarletteHTTPException):
        return http_error_response(exc.status_code, exc.detail, method, path, exc.headers)
    if isinstance(exc, RecursionError):
        # Input nested so deeply that handling it ran out of stack (a parser, a validator).
        log.warning("input nested too deeply on %s %s: %s", method, path, exc)
        return error_response(422, "invalid_request", "the request is nested too deeply to process")
    if isinstance(exc, psycopg.DataError):
        # A value Postgres refuses (a NUL character, a number out of range): the client's.
        log.warning("unstorable value on %s %s: %s", method, path, exc)
        return error_response(
            422,
            "invalid_request",
            "the request holds a value that cannot be stored "
            "(for example a NUL character or a number out of range)",
        )
    return None


def install_error_handlers(app: FastAPI) -> None:
    async def known(request: Request, exc: Exception) -> JSONResponse:
        answer = known_error(exc, request.method, request.url.path)
        if answer is None:  # registered only for the types known_error maps
            raise exc
        return answer

    for kind in (
        TraceError,
        DagInvalid,
        RequestValidationError,
        StarletteHTTPException,
        RecursionError,
        psycopg.DataError,
    ):
        app.add_exception_handler(kind, known)


async def answer_unless_started(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    errors: type[Exception] | tuple[type[Exception], ...],
    answer: Callable[[Exception], Response],
) -> None:
    """Runs `app`; if it raises one of `errors`, `answer(exc)` is sent instead, unless the app
    had already started its own response: then the error propagates (too late for a response,
    the server closes the connection). `answer` is called either way, inside the `except`."""
    started = False

    async def tracked(message: Message) -> None:
        nonlocal started
        if message["type"] == "http.response.start":
            started = True
        await send(message)

    try:
        await app(scope, receive, tracked)
    except errors as exc:
        response = answer(exc)
        if started:
            raise
        await response(scope, receive, send)


def _internal_error(scope: Scope) -> Response:
    """Called while handling the exception: logs its traceback under a fresh id."""
    error_id = uuid.uuid4().hex
    log.exception("unhandled error %s on %s %s", error_id, scope.get("method"), scope.get("path"))
    return error_response(
        500, "internal", f"internal error (logged as {error_id})", {"error_id": error_id}
    )


class LastResort:
    """Anything no handler maps answers a 500 in Trace's shape, with an id to find the logged
    traceback and nothing of the internals. Unlike Starlette's ServerErrorMiddleware it does not
    re-raise, so the server keeps the connection instead of dropping it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await answer_unless_started(
            self.app, scope, receive, send, Exception, lambda _: _internal_error(scope)
        )
