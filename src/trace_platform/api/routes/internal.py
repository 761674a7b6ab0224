"""`/internal/*`: the worker wrapper's side of the Dispatcher (claim, fetch, secrets,
heartbeat, events, completion, the batches of claims and completions, and the exchange that
carries both). Every route needs
the platform's internal token, checked for all of `/internal/*` before a body is read
(`api/gateway.py` InternalToken).

The hot routes answer pre-serialized JSON (`_json`): the model is built once by the Dispatcher,
so FastAPI's response validation and `jsonable_encoder` (a second walk over every payload)
would only cost CPU on the path every task takes."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Header, Query, Response
from pydantic import BaseModel

from trace_platform.api.routes import trace_router
from trace_platform.contract import (
    MAX_ATTEMPT,
    MAX_BATCH,
    BatchError,
    BufferPublishBody,
    BufferPublishRequest,
    BufferPublishResponse,
    Claim,
    ClaimBatchBody,
    ClaimBatchResponse,
    ClaimRequest,
    ClaimResult,
    CompleteBatchBody,
    CompleteBatchResponse,
    CompleteBody,
    CompleteRequest,
    CompleteResponse,
    CompleteResult,
    EventsBody,
    EventsRequest,
    EventsResponse,
    ExchangeBody,
    ExchangeResponse,
    HeartbeatBody,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRef,
    TaskPayload,
)
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.errors import Invalid, TraceError
from trace_platform.services import Services


def lease_ref(
    task_id: UUID,
    attempt: Annotated[int, Query(gt=0, le=MAX_ATTEMPT)],
    x_lease_token: Annotated[UUID, Header()],
) -> LeaseRef:
    """Every fenced call's lease reference, the one way it travels (see `LeaseRef`)."""
    return LeaseRef(task_id=task_id, attempt=attempt, lease_token=x_lease_token)


Lease = Annotated[LeaseRef, Depends(lease_ref)]


def _json(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


def _doc(model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The 200 answer's schema for the OpenAPI document (the route itself returns bytes)."""
    return {200: {"model": model}}


def _batch_error(e: TraceError) -> BatchError:
    return BatchError(status=e.status_code, error=e.code, message=e.message, detail=e.detail)


def _claim_results(
    reqs: list[ClaimRequest], answers: list[Claim | TraceError]
) -> list[ClaimResult]:
    return [
        ClaimResult(task_id=req.task_id, error=_batch_error(got))
        if isinstance(got, TraceError)
        else ClaimResult(task_id=req.task_id, claim=got)
        for req, got in zip(reqs, answers, strict=True)
    ]


def _complete_results(
    reqs: list[CompleteRequest], answers: list[CompleteResponse | TraceError]
) -> list[CompleteResult]:
    return [
        CompleteResult(task_id=req.task_id, error=_batch_error(got))
        if isinstance(got, TraceError)
        else CompleteResult(task_id=req.task_id, response=got)
        for req, got in zip(reqs, answers, strict=True)
    ]


def lease_tokens(header: str, n: int) -> list[UUID]:
    """The complete-batch's `X-Lease-Tokens`: exactly one token per completion, in order.
    A refusal names the position, never a token (a token is a secret, even a wrong one)."""
    parts = [p.strip() for p in header.split(",")] if header.strip() else []
    if len(parts) != n:
        raise Invalid(
            f"X-Lease-Tokens holds {len(parts)} token(s); the body has {n} completion(s) "
            "(one token per completion, in the body's order, comma-separated)"
        )
    tokens = []
    for i, part in enumerate(parts):
        try:
            tokens.append(UUID(part))
        except ValueError:
            raise Invalid(f"X-Lease-Tokens: token {i + 1} of {n} is not a UUID") from None
    return tokens


def exchange_answer(d: Dispatcher, body: ExchangeBody, x_lease_tokens: str | None) -> bytes:
    """The exchange's answer, as JSON: the route's and the workers' listener's
    (api/exchange_listener.py), so the two cannot differ."""
    tokens = lease_tokens(x_lease_tokens or "", len(body.completions))
    reqs = [
        CompleteRequest(**dict(item), lease_token=token)
        for item, token in zip(body.completions, tokens, strict=True)
    ]
    completed, claimed = d.exchange(reqs, body.claims)
    answer = ExchangeResponse(
        completions=_complete_results(reqs, completed),
        claims=_claim_results(body.claims, claimed),
    )
    return answer.model_dump_json().encode()


def router(services: Services) -> APIRouter:
    d = services.dispatcher
    r = trace_router()

    # First: the route a busy worker calls most (routes are matched in order, each a regex).
    @r.post("/internal/exchange", response_class=Response, responses=_doc(ExchangeResponse))
    def exchange(
        body: ExchangeBody, x_lease_tokens: Annotated[str | None, Header()] = None
    ) -> Response:
        """A worker's completions and its next claims in one request (and, for the plain
        ones, one commit): each answered as `/internal/complete-batch` and
        `/internal/claim-batch` would. The completions' lease tokens are in
        `X-Lease-Tokens`, as for a complete-batch (no header when there is no completion)."""
        return Response(exchange_answer(d, body, x_lease_tokens), media_type="application/json")

    @r.post("/internal/claim", response_class=Response, responses=_doc(Claim))
    def claim(body: ClaimRequest) -> Response:
        return _json(d.claim(body, payload=True))  # the task-fetch payload rides along

    @r.post("/internal/claim-batch", response_class=Response, responses=_doc(ClaimBatchResponse))
    def claim_batch(body: ClaimBatchBody) -> Response:
        """Up to MAX_BATCH wake-ups; each answered as `/internal/claim` would (a claim with
        its payload, or the error), plain ones leased in one transaction."""
        return _json(
            ClaimBatchResponse(results=_claim_results(body.claims, d.claim_many(body.claims)))
        )

    @r.get("/internal/task-fetch", response_class=Response, responses=_doc(TaskPayload))
    def task_fetch(ref: Lease) -> Response:
        return _json(d.fetch(ref))

    @r.get("/internal/task-secrets")
    def task_secrets(ref: Lease) -> dict[str, str]:
        return d.secrets(ref)

    @r.post("/internal/heartbeat", response_class=Response, responses=_doc(HeartbeatResponse))
    def heartbeat(ref: Lease, body: HeartbeatBody) -> Response:
        return _json(d.heartbeat(HeartbeatRequest(**dict(ref), **dict(body))))

    @r.post("/internal/events")
    def events(ref: Lease, body: EventsBody) -> EventsResponse:
        return d.events(EventsRequest(**dict(ref), **dict(body)))

    @r.post("/internal/buffer-publish")
    def buffer_publish(ref: Lease, body: BufferPublishBody) -> BufferPublishResponse:
        """A batch for a buffered dataset: stored as a record, queued for the sink."""
        return d.buffers.publish(BufferPublishRequest(**dict(ref), **dict(body)))

    @r.post("/internal/task-complete", response_class=Response, responses=_doc(CompleteResponse))
    def task_complete(ref: Lease, body: CompleteBody) -> Response:
        return _json(d.complete(CompleteRequest(**dict(ref), **dict(body))))

    @r.post(
        "/internal/complete-batch", response_class=Response, responses=_doc(CompleteBatchResponse)
    )
    def complete_batch(
        body: CompleteBatchBody, x_lease_tokens: Annotated[str, Header()]
    ) -> Response:
        """Up to MAX_BATCH completions, each fenced by its own attempt and lease token (in
        `X-Lease-Tokens`) and answered as `/internal/task-complete` would; a refused one
        commits nothing."""
        tokens = lease_tokens(x_lease_tokens, len(body.completions))
        reqs = [
            CompleteRequest(**dict(item), lease_token=token)
            for item, token in zip(body.completions, tokens, strict=True)
        ]
        results = _complete_results(reqs, d.complete_many(reqs))
        return _json(CompleteBatchResponse(results=results))

    assert MAX_BATCH * 37 < 8 * 1024  # a full X-Lease-Tokens header fits any server's limit
    return r
