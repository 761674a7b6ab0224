"""HTTP client of the Dispatcher's internal API, held by the wrapper only (never the operator)."""

from __future__ import annotations

import time
from typing import Any, TypeVar
from uuid import UUID

import httpx
from pydantic import BaseModel

from trace_platform.contract import (
    Claim,
    ClaimRequest,
    CompleteBody,
    CompleteResponse,
    EventIn,
    EventsBody,
    EventsResponse,
    HeartbeatBody,
    HeartbeatResponse,
    LeaseRef,
    OutputCommit,
    TaskPayload,
    lease_params,
)

T = TypeVar("T", bound=BaseModel)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def transient(e: Exception) -> bool:
    """A failure that says nothing about the lease: the API unreachable, timing out, or
    answering with a server error (restarting, overloaded). Anything else is its answer."""
    return isinstance(e, httpx.TransportError) or (isinstance(e, ApiError) and e.status >= 500)


class DispatcherClient:
    def __init__(
        self,
        base_url: str,
        *,
        internal_token: str | None = None,
        timeout: float = 30.0,
        retries: int = 5,
    ) -> None:
        headers = {"Content-Type": "application/json"}
        if internal_token:
            headers["X-Internal-Token"] = internal_token
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)
        self.retries = retries

    def _call(
        self, method: str, path: str, out: type[T], retries: int | None = None, **kw: Any
    ) -> T:
        """Transport failures are retried (every call is idempotent or fenced); HTTP errors
        are raised as ApiError with the server's code and message."""
        retries = self.retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                r = self.http.request(method, path, **kw)
                break
            except httpx.TransportError:
                if attempt == retries:
                    raise
                time.sleep(min(2.0, 0.1 * 2**attempt))
        if r.status_code >= 400:
            try:
                body = r.json()
                raise ApiError(
                    r.status_code, body.get("error", "error"), body.get("message", r.text)
                )
            except ValueError:
                raise ApiError(r.status_code, "error", r.text) from None
        return out.model_validate(r.json())

    def claim(self, task_id: UUID, worker_id: str) -> Claim:
        body = ClaimRequest(task_id=task_id, worker_id=worker_id)
        return self._call("POST", "/internal/claim", Claim, content=body.model_dump_json())

    def fetch(self, claim: Claim) -> TaskPayload:
        return self._call(
            "GET",
            "/internal/task-fetch",
            TaskPayload,
            **_lease(claim),
        )

    def secrets(self, claim: Claim) -> dict[str, str]:
        r = self.http.get("/internal/task-secrets", **_lease(claim))
        if r.status_code >= 400:
            body = r.json()
            raise ApiError(r.status_code, body.get("error", "error"), body.get("message", r.text))
        return dict(r.json())

    def heartbeat(
        self, claim: Claim, progress: dict[str, Any] | None = None, timeout: float = 5.0
    ) -> HeartbeatResponse:
        """One try within `timeout`: the wrapper's loop retries (it must keep serving its
        operator meanwhile, and knows how long the lease holds)."""
        body = HeartbeatBody(progress=progress)
        return self._call(
            "POST",
            "/internal/heartbeat",
            HeartbeatResponse,
            retries=0,
            content=body.model_dump_json(),
            timeout=timeout,
            **_lease(claim),
        )

    def events(self, claim: Claim, events: list[EventIn]) -> EventsResponse:
        body = EventsBody(events=events)
        return self._call(
            "POST",
            "/internal/events",
            EventsResponse,
            content=body.model_dump_json(),
            **_lease(claim),
        )

    def complete(
        self,
        claim: Claim,
        outcome: str,
        *,
        error: str | None = None,
        retryable: bool = True,
        final_events: list[EventIn] | None = None,
        outputs: list[OutputCommit] | None = None,
        operator_state: dict[str, Any] | None = None,
        operator_state_revision: int = 0,
    ) -> CompleteResponse:
        body = CompleteBody(
            outcome=outcome,
            error=error,
            retryable=retryable,  # type: ignore[arg-type]
            final_events=final_events or [],
            outputs=outputs or [],
            operator_state=operator_state,
            operator_state_revision=operator_state_revision,
        )
        return self._call(
            "POST",
            "/internal/task-complete",
            CompleteResponse,
            content=body.model_dump_json(),
            **_lease(claim),
        )

    def close(self) -> None:
        self.http.close()


def _lease(claim: Claim) -> dict[str, Any]:
    ref = LeaseRef(task_id=claim.task_id, attempt=claim.attempt, lease_token=claim.lease_token)
    return lease_params(ref)
