"""Dispatcher errors; the API maps each to its HTTP status with a JSON body."""

from __future__ import annotations


class DispatcherError(Exception):
    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, **detail: object) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class NotFound(DispatcherError):
    status_code = 404
    code = "not_found"


class Conflict(DispatcherError):
    """Stale attempt, wrong lease token, task not claimable, task already finished."""

    status_code = 409

    def __init__(self, code: str, message: str, **detail: object) -> None:
        super().__init__(message, **detail)
        self.code = code


class Invalid(DispatcherError):
    status_code = 422
    code = "invalid"


class Unauthorized(DispatcherError):
    status_code = 401
    code = "unauthorized"


class Forbidden(DispatcherError):
    status_code = 403
    code = "forbidden"
