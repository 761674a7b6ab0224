"""Which entry a request came through and its request id, for the audit log (audit.via): every
user-facing route's actions record `http`, a named webhook's `webhook`. The id is the caller's
`X-Request-Id` when it is a plain token (the API Gateway entry puts its own there), else a new
one; the answer carries it back, so a caller can find its action in `trace audit list`."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trace_platform import audit
from trace_platform.api.gateway import _route_path

HEADER = b"x-request-id"


class AuditSource:
    """A pure ASGI middleware (as BodyLimit is): the request's handling, in its threads too,
    runs inside `audit.via`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == HEADER), b"")
        request_id = audit.clean_request_id(given.decode("latin-1")) or uuid.uuid4().hex
        source = "webhook" if _route_path(scope).startswith("/v1/hooks/") else "http"

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id.encode())]}
            await send(message)

        with audit.via(source, request_id):
            await self.app(scope, receive, tagged)
