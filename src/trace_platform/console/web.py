"""What every console page shares: who is calling (the API key in an HttpOnly cookie, checked by
the API's own `actor_dependency`), CSRF checks of every POST, the templates, and the headers
(a Content-Security-Policy of `default-src 'self'`: the pages carry no inline script or style).

A console route raises the control plane's errors as the API's routes do; `ConsoleRoute`
answers them as an HTML page (401: to the login page) instead of JSON."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, unquote

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, PackageLoader, select_autoescape

from trace_platform.api.auth import ActorDependency
from trace_platform.api.errors import describe_validation, shorten
from trace_platform.api.gateway import TraceRoute
from trace_platform.errors import Forbidden, Invalid, NotFound, TraceError, Unauthorized
from trace_platform.identity import Actor

KEY_COOKIE = "trace_console_key"
CSRF_COOKIE = "trace_console_csrf"
FLASH_COOKIE = "trace_console_flash"
PREFIX = "/console"
# No inline script or style anywhere: everything comes from /console/static.
CSP = (
    "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; "
    "object-src 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

templates = Environment(
    loader=PackageLoader("trace_platform.console", "templates"),
    autoescape=select_autoescape(["html", "svg"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _duration(start: datetime | None, end: datetime | None = None) -> str:
    if start is None:
        return ""
    seconds = ((end or datetime.now(UTC)) - start).total_seconds()
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


templates.filters["duration"] = _duration
templates.filters["when"] = lambda t: t.strftime("%Y-%m-%d %H:%M:%S") if t else ""

T = TypeVar("T")


def attempt(call: Callable[[], T]) -> tuple[T | None, str | None]:
    """`call`'s value and no error, or no value and the message of the TraceError it raised:
    for a part of a page that shows why it is missing while the rest still shows."""
    try:
        return call(), None
    except TraceError as e:
        return None, e.message


def user_of(actor: ActorDependency) -> Callable[[Request], Actor]:
    """A dependency: the caller, by the key their login stored, through the API's own check
    (so a revoked or expired key stops the console as it stops the API). No cookie: nobody,
    even where the API's permissive auth would act as the Lite admin."""

    def user(request: Request) -> Actor:
        key = request.cookies.get(KEY_COOKIE)
        if not key:
            raise Unauthorized("log in with an API key")
        return actor(authorization=f"Bearer {key}")

    return user


def _same_origin(request: Request) -> bool:
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    origin = request.headers.get("origin")
    if origin is not None:  # "null" (a sandboxed or privacy-stripped page) is not ours either
        return origin == own
    # No Origin: a non-browser client or an old browser, which the token still checks; but a
    # browser that says the post came from another site (Fetch metadata, or the page it left)
    # is believed.
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    referer = request.headers.get("referer")
    return referer is None or referer == own or referer.startswith(own + "/")


async def form(request: Request) -> dict[str, str]:
    """A POST's url-encoded form, once its CSRF token (the double-submitted cookie) and its
    Origin are checked: 403 otherwise."""
    fields = dict(parse_qsl((await request.body()).decode("utf-8", "replace")))
    token = request.cookies.get(CSRF_COOKIE, "")
    given = fields.pop("csrf", "")
    if not token or not secrets.compare_digest(token.encode(), given.encode()):
        raise Forbidden("the form's CSRF token is missing or wrong: reload the page")
    if not _same_origin(request):
        raise Forbidden("a console form must come from the console's own origin")
    return fields


def _cookie(response: Response, request: Request, name: str, value: str, age: int | None) -> None:
    response.set_cookie(
        name,
        value,
        max_age=age,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def render(request: Request, template: str, status: int = 200, /, **context: Any) -> HTMLResponse:
    """A page (or a partial) with the CSRF token its forms post back and any flash message."""
    token = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
    flash = unquote(request.cookies.get(FLASH_COOKIE, ""))
    body = templates.get_template(template).render(
        csrf=token, flash=flash, prefix=PREFIX, request=request, **context
    )
    response = HTMLResponse(body, status_code=status)
    if CSRF_COOKIE not in request.cookies:
        _cookie(response, request, CSRF_COOKIE, token, None)
    if flash:
        response.delete_cookie(FLASH_COOKIE, path=PREFIX)
    return response


def redirect(request: Request, path: str, flash: str | None = None) -> RedirectResponse:
    """After a POST: back to a page (303), with a one-time message for it."""
    response = RedirectResponse(PREFIX + path, status_code=303)
    if flash:
        _cookie(response, request, FLASH_COOKIE, quote(flash)[:1000], 60)
    return response


def log_in(request: Request, key: str) -> RedirectResponse:
    response = RedirectResponse(PREFIX + "/", status_code=303)
    _cookie(response, request, KEY_COOKIE, key, 12 * 3600)
    # A new token at each login: one seen before it is worth nothing after.
    _cookie(response, request, CSRF_COOKIE, secrets.token_urlsafe(32), None)
    return response


def log_out(request: Request) -> RedirectResponse:
    response = RedirectResponse(PREFIX + "/login", status_code=303)
    response.delete_cookie(KEY_COOKIE, path=PREFIX)
    return response


def _as_trace_error(e: RequestValidationError) -> TraceError:
    """FastAPI's refusal of a request's parameters, as the console says it: a path whose id is
    no id (`/console/runs/not-a-uuid`) names nothing, like an id that exists nowhere; any other
    parameter is invalid."""
    for err in e.errors():
        loc = err.get("loc", ())
        if loc[:1] == ("path",):
            what = str(loc[-1]).replace("_", " ")
            return NotFound(f"nothing here: {shorten(repr(err.get('input')), 100)} is no {what}")
    return Invalid(describe_validation(e)[0])


def _refused(request: Request, e: TraceError) -> Response:
    if isinstance(e, Unauthorized):
        response = render(request, "login.html", 401, error=e.message)
        # Only a key that was refused is forgotten: a request that came without one (a link
        # from another site: SameSite=Strict keeps the cookie back) must not log the browser
        # out.
        if KEY_COOKIE in request.cookies:
            response.delete_cookie(KEY_COOKIE, path=PREFIX)
        return response
    return render(request, "error.html", e.status_code, error=e.message, code=e.code)


class ConsoleRoute(TraceRoute):
    """A console route: the gateway's checks, errors as HTML pages (FastAPI's own refusal of
    a parameter too, which would otherwise be the API's JSON), and the security headers on
    every answer."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route_handler(request: Request) -> Response:
            try:
                response = await handler(request)
            except TraceError as e:
                response = _refused(request, e)
            except RequestValidationError as e:
                response = _refused(request, _as_trace_error(e))
            for k, v in SECURITY_HEADERS.items():
                response.headers.setdefault(k, v)
            return response

        return route_handler
