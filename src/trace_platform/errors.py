"""Trace's one error hierarchy; the API maps each error to its HTTP status with a JSON body.

Every package raises these (or its own subclasses of `TraceError`: the query service's limits,
the vault's `SecretsUnavailable`), so a gateway needs one handler for all of them."""

from __future__ import annotations


class TraceError(Exception):
    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, **detail: object) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class NotFound(TraceError):
    status_code = 404
    code = "not_found"


class Gone(TraceError):
    """What was asked for existed and left Postgres by retention (exported, then dropped)."""

    status_code = 410
    code = "exported"


class Conflict(TraceError):
    """Stale attempt, wrong lease token, task not claimable, task already finished."""

    status_code = 409

    def __init__(self, code: str, message: str, **detail: object) -> None:
        super().__init__(message, **detail)
        self.code = code


class Invalid(TraceError):
    status_code = 422
    code = "invalid"


class Unauthorized(TraceError):
    status_code = 401
    code = "unauthorized"


class Forbidden(TraceError):
    status_code = 403
    code = "forbidden"


class ServerFault(TraceError):
    """One item of a batch failed on the server (a bug, a lost connection): it answers for
    that item alone, and the caller may retry it as it would a 500."""

    status_code = 500
    code = "internal"
