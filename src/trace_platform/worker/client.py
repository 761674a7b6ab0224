"""HTTP client of the Dispatcher's internal API, held by the wrapper only (never the operator).

One client serves all of a worker's wrappers. The worker's loop (`worker/reactor.py`) sends
all the claims and completions it has at once (`exchange`); the threads that supervise longer
attempts have theirs coalesced (`worker/batching.py`) when more than one is waiting. Either way
one request and one commit carry them: `/internal/exchange` when it holds both (finished
attempts and next wake-ups), else `/internal/claim-batch` or `/internal/complete-batch` (a lone
item: its one-task route)."""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast
from uuid import UUID, uuid4

from pydantic import BaseModel

from trace_platform.contract import (
    LEASE_TOKENS_HEADER,
    MAX_BATCH,
    BatchError,
    BufferPublishBody,
    BufferPublishResponse,
    Claim,
    ClaimBatchBody,
    ClaimBatchResponse,
    ClaimRequest,
    CompleteBatchBody,
    CompleteBatchResponse,
    CompleteItem,
    CompleteResponse,
    EventIn,
    EventsBody,
    EventsResponse,
    ExchangeBody,
    ExchangeResponse,
    HeartbeatBody,
    HeartbeatResponse,
    LeaseRef,
    OutputCommit,
    TaskPayload,
    lease_params,
)
from trace_platform.contract_fleet import WorkerBeat, WorkerRef, WorkerRegistration
from trace_platform.metrics.worker import WorkerMetrics
from trace_platform.worker.batching import Batcher
from trace_platform.worker.http import Response, Transport, TransportError, pool_size

log = logging.getLogger(__name__)

# A completion larger than this (events, outputs, state) goes alone: a batch stays far below
# the API's body limit whatever it holds.
MAX_BATCHED_COMPLETION_BYTES = 16 * 1024
# Seconds the API's routes carry the exchange after its listener could not be reached
# (doubled for each failure in a row, up to the max).
LISTENER_PAUSE = 5.0
LISTENER_PAUSE_MAX = 60.0

T = TypeVar("T", bound=BaseModel)
T2 = TypeVar("T2")
# One item of a worker's exchange with the API: a wake-up to claim, or an attempt's report.
Ask = ClaimRequest | tuple[Claim, CompleteItem]


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def transient(e: Exception) -> bool:
    """A failure that says nothing about the lease: the API unreachable, timing out, or
    answering with a server error (restarting, overloaded). Anything else is its answer."""
    return isinstance(e, TransportError) or (isinstance(e, ApiError) and e.status >= 500)


class DispatcherClient:
    def __init__(
        self,
        base_url: str,
        *,
        internal_token: str | None = None,
        timeout: float = 30.0,
        retries: int = 5,
        wrappers: int = 8,
        exchange_url: str | None = None,
        tls: ssl.SSLContext | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        """`wrappers`: how many wrappers share this client (sizes its connections);
        `exchange_url`: the API's exchange listener (api/exchange_listener.py), which then
        carries every claim and every batched completion, lone ones included, while it can
        be reached (else the API's routes do); `tls`: what an https API and listener are
        verified with (trace_platform.tls.client_context; default certifi's CAs); `metrics`:
        the worker's, counting every claim, report and heartbeat answered."""
        self.metrics = metrics
        headers = {"Content-Type": "application/json"}
        if internal_token:
            headers["X-Internal-Token"] = internal_token
        self.http = Transport(base_url, headers, timeout, pool_size(wrappers), tls)
        # One batch is in flight at a time (the batcher's), so two connections are plenty.
        self.listener = Transport(exchange_url, headers, timeout, 2, tls) if exchange_url else None
        self._listener_back_at = 0.0  # after a failure to reach it: when to try it again
        self._listener_failures = 0  # in a row
        self.retries = retries
        self.timeout = timeout
        # Off when the API answers a batch route 404/405 (an older API): one call per task;
        # `exchanges` likewise for `/internal/exchange` (then claims and completions apart).
        self.batches = True
        self.exchanges = True
        # Off when the API refuses a claim's key as an unknown field (an older API).
        self.claim_keys = True
        self._exchange: Batcher[Ask, Claim | CompleteResponse] = Batcher(
            self._exchange_batch, MAX_BATCH
        )

    def _call(
        self,
        method: str,
        path: str,
        out: type[T],
        retries: int | None = None,
        transport: Transport | None = None,
        **kw: Any,
    ) -> T:
        """Transport failures are retried (every call is idempotent or fenced); HTTP errors
        are raised as ApiError with the server's code and message."""
        retries = self.retries if retries is None else retries
        http = transport or self.http
        for attempt in range(retries + 1):
            began = time.monotonic()
            try:
                r = http.request(method, path, **kw)
                break
            except TransportError as e:
                # Said, not only retried: a request that waited out its timeout (30 s) was
                # otherwise invisible in the worker's log (only its slow effects were seen).
                log.warning(
                    "%s %s: no answer after %.1fs (%s); %s",
                    method,
                    path,
                    time.monotonic() - began,
                    e,
                    "giving up" if attempt == retries else f"try {attempt + 2} of {retries + 1}",
                )
                if attempt == retries:
                    raise
                time.sleep(min(2.0, 0.1 * 2**attempt))
        _raise_for_status(r)
        return out.model_validate_json(r.content)

    def claim(self, task_id: UUID, worker_id: str, claim_id: UUID | None = None) -> Claim:
        """Leases the task (with its payload); raises ApiError when it is not claimable. The
        claim's key (`claim_id`, a new random one by default) goes with every try of it, so a
        retry after a lost answer gets the lease that request took (ClaimRequest.claim_id);
        the caller passes the same key again to retry it itself."""
        key = (claim_id or uuid4()) if self.claim_keys else None
        req = ClaimRequest(task_id=task_id, worker_id=worker_id, claim_id=key)
        return cast(Claim, self._counted(req, lambda: self._exchange.submit(req)))

    def _counted(self, ask: Ask, call: Callable[[], T2]) -> T2:
        """`call`'s answer to `ask`, counted in the worker's metrics (an error as its answer)."""
        began = time.monotonic()
        try:
            answer = call()
        except Exception as e:
            if self.metrics is not None:
                self.metrics.answered([ask], [e], time.monotonic() - began)
            raise
        if self.metrics is not None:
            self.metrics.answered([ask], [answer], time.monotonic() - began)
        return answer

    def _exchange_batch(self, asks: list[Ask]) -> list[Claim | CompleteResponse | BaseException]:
        """The claims and completions waiting together, answered in their order: both kinds
        in one `/internal/exchange`, one kind alone on its own batch route."""
        claims = [a for a in asks if isinstance(a, ClaimRequest)]
        completions = [a for a in asks if not isinstance(a, ClaimRequest)]
        claimed: list[Claim | BaseException] | None = None
        completed: list[CompleteResponse | BaseException] | None = None
        refused = False
        if self._listener_up():
            try:
                completed, claimed = self._exchange_call(completions, claims, listener=True)
                self._listener_failures = 0
            except (TransportError, ApiError, ValueError) as e:
                refused = isinstance(e, ApiError) and _whole_batch_refused(e)
                if not refused:
                    self._listener_failed(e)
        if claimed is None and not refused and claims and completions and self.exchanges:
            try:
                completed, claimed = self._exchange_call(completions, claims)
            except ApiError as e:
                if e.status in (404, 405):
                    self.exchanges = False  # an older API: claims and completions apart
                elif not _whole_batch_refused(e):
                    raise
        # Refused as a whole (one item's body fault, a task twice): each kind on its own
        # batch route, where a refusal falls back to one item at a time.
        # Apart: the completions first, as the exchange lands them.
        if completed is None:
            completed = self._complete_batch(completions) if completions else []
        if claimed is None:
            claimed = self._claim_batch(claims) if claims else []
        next_claim, next_completion = iter(claimed), iter(completed)
        return [
            next(next_claim) if isinstance(a, ClaimRequest) else next(next_completion) for a in asks
        ]

    def _listener_up(self) -> bool:
        return self.listener is not None and time.monotonic() >= self._listener_back_at

    def _listener_failed(self, e: Exception) -> None:
        """The exchange goes to the API's routes instead: for LISTENER_PAUSE seconds when the
        listener could not answer (unreachable, a server error), for good when what answers
        is no listener of this API (401, 404, 405, an answer that is not an exchange's)."""
        if isinstance(e, TransportError) or (isinstance(e, ApiError) and e.status >= 500):
            # Twice as long after each failure in a row (a listener gone for good, e.g. an
            # API without one, costs a try a minute, not a warning every 5 s); an answer
            # resets it.
            pause = min(LISTENER_PAUSE * 2**self._listener_failures, LISTENER_PAUSE_MAX)
            self._listener_failures += 1
            log.warning("exchange listener: %s; using the API for %.0fs", e, pause)
            self._listener_back_at = time.monotonic() + pause
            return
        log.warning("exchange listener: %s; not used from now on", e)
        if self.listener is not None:
            self.listener.close()
        self.listener = None

    def _exchange_call(
        self,
        completions: list[tuple[Claim, CompleteItem]],
        claims: list[ClaimRequest],
        listener: bool = False,
    ) -> tuple[list[CompleteResponse | BaseException], list[Claim | BaseException]]:
        """One exchange: on the API's route, or (`listener`) on its listener, tried once (a
        failure to reach it goes to the API's routes, which retry)."""
        body = ExchangeBody(completions=[i for _, i in completions], claims=claims)
        tokens = ",".join(str(c.lease_token) for c, _ in completions)
        got = self._call(
            "POST",
            "/internal/exchange",
            ExchangeResponse,
            retries=0 if listener else None,
            transport=self.listener if listener else None,
            content=body.model_dump_json(),
            headers={LEASE_TOKENS_HEADER: tokens},
        )
        _check_answers(len(got.completions), len(completions))
        _check_answers(len(got.claims), len(claims))
        return (
            [
                r.response if r.response is not None else _item_error(r.error)
                for r in got.completions
            ],
            [r.claim if r.claim is not None else _item_error(r.error) for r in got.claims],
        )

    def _claim_one(self, body: ClaimRequest) -> Claim:
        try:
            return self._call(
                "POST", "/internal/claim", Claim, content=body.model_dump_json(exclude_none=True)
            )
        except ApiError as e:
            if body.claim_id is not None and _refuses_claim_keys(e):
                self.claim_keys = False  # an older API: claims without a key from now on
                return self._claim_one(body.model_copy(update={"claim_id": None}))
            raise

    def _claim_batch(self, reqs: list[ClaimRequest]) -> list[Claim | BaseException]:
        if len(reqs) == 1 or not self.batches:
            return [_answer(lambda r=r: self._claim_one(r)) for r in reqs]
        try:
            body = ClaimBatchBody(claims=reqs).model_dump_json(exclude_none=True)
            got = self._call("POST", "/internal/claim-batch", ClaimBatchResponse, content=body)
        except ApiError as e:
            if e.status in (404, 405):
                self.batches = False  # an older API: one claim per task from now on
                return self._claim_batch(reqs)
            if _whole_batch_refused(e):  # one item's fault: each answered on its own
                return [_answer(lambda r=r: self._claim_one(r)) for r in reqs]
            raise
        _check_answers(len(got.results), len(reqs))
        return [r.claim if r.claim is not None else _item_error(r.error) for r in got.results]

    def fetch(self, claim: Claim) -> TaskPayload:
        return self._call(
            "GET",
            "/internal/task-fetch",
            TaskPayload,
            **_lease(claim),
        )

    def secrets(self, claim: Claim) -> dict[str, str]:
        r = self.http.request("GET", "/internal/task-secrets", **_lease(claim))
        _raise_for_status(r)
        got = json.loads(r.content)
        if not isinstance(got, dict) or not all(isinstance(v, str) for v in got.values()):
            raise ApiError(502, "bad_gateway", "task-secrets answered something not names to text")
        return got

    def heartbeat(
        self, claim: Claim, progress: dict[str, Any] | None = None, timeout: float = 5.0
    ) -> HeartbeatResponse:
        """One try within `timeout`: the wrapper's loop retries (it must keep serving its
        operator meanwhile, and knows how long the lease holds)."""
        body = HeartbeatBody(progress=progress)
        try:
            answer = self._call(
                "POST",
                "/internal/heartbeat",
                HeartbeatResponse,
                retries=0,
                content=body.model_dump_json(),
                timeout=timeout,
                **_lease(claim),
            )
        except Exception as e:
            if self.metrics is not None:
                self.metrics.heartbeat(e)
            raise
        if self.metrics is not None:
            self.metrics.heartbeat(answer)
        return answer

    def events(self, claim: Claim, events: list[EventIn]) -> EventsResponse:
        body = EventsBody(events=events)
        return self._call(
            "POST",
            "/internal/events",
            EventsResponse,
            content=body.model_dump_json(),
            **_lease(claim),
        )

    def buffer_publish(self, claim: Claim, body: BufferPublishBody) -> BufferPublishResponse:
        """A batch's pointer for a buffered dataset (idempotent: the same artifact published
        again answers the same record)."""
        return self._call(
            "POST",
            "/internal/buffer-publish",
            BufferPublishResponse,
            content=body.model_dump_json(),
            **_lease(claim),
        )

    def complete(self, claim: Claim, outcome: str, **report: Any) -> CompleteResponse:
        """The attempt's report (`complete_item`'s arguments)."""
        item = complete_item(claim, outcome, **report)
        if _oversize(item):
            return self._counted((claim, item), lambda: self._complete_one(claim, item))
        return cast(
            CompleteResponse,
            self._counted((claim, item), lambda: self._exchange.submit((claim, item))),
        )

    def exchange(self, asks: list[Ask]) -> list[Claim | CompleteResponse | BaseException]:
        """Claims and completions together, answered each in its order (an error is that
        item's): a worker's loop sends all it has at once. A completion over
        MAX_BATCHED_COMPLETION_BYTES goes alone; an error of the request itself is every
        other item's."""
        began = time.monotonic()
        answers: dict[int, Claim | CompleteResponse | BaseException] = {}
        for n, ask in enumerate(asks):
            if isinstance(ask, ClaimRequest):
                continue
            try:
                oversize = _oversize(ask[1])
            except ValueError as e:  # not serializable (nested past the serializer's depth)
                answers[n] = e
                continue
            if oversize:
                answers[n] = _answer(lambda a=ask: self._complete_one(*a))
        rest = [n for n in range(len(asks)) if n not in answers]
        for start in range(0, len(rest), MAX_BATCH):
            part = rest[start : start + MAX_BATCH]
            got: list[Claim | CompleteResponse | BaseException]
            try:
                got = self._exchange_batch([asks[n] for n in part])
            except Exception as e:
                got = [e] * len(part)
            answers.update(zip(part, got, strict=True))
        ordered = [answers[n] for n in range(len(asks))]
        if self.metrics is not None:
            self.metrics.answered(asks, ordered, time.monotonic() - began)
        return ordered

    def claim_request(self, task_id: UUID, worker_id: str) -> ClaimRequest:
        """A claim of the task with a fresh key (unless the API takes none): tried again with
        the same request, a claim whose answer was lost gets the lease it took."""
        return ClaimRequest(
            task_id=task_id, worker_id=worker_id, claim_id=uuid4() if self.claim_keys else None
        )

    def _complete_one(self, claim: Claim, item: CompleteItem) -> CompleteResponse:
        body = item.model_dump_json(exclude={"task_id", "attempt"})
        return self._call(
            "POST", "/internal/task-complete", CompleteResponse, content=body, **_lease(claim)
        )

    def _complete_batch(
        self, items: list[tuple[Claim, CompleteItem]]
    ) -> list[CompleteResponse | BaseException]:
        if len(items) == 1 or not self.batches:
            return [_answer(lambda c=c, i=i: self._complete_one(c, i)) for c, i in items]
        body = CompleteBatchBody(completions=[i for _, i in items]).model_dump_json()
        # The lease tokens travel in a header, one per completion in the body's order.
        tokens = ",".join(str(c.lease_token) for c, _ in items)
        try:
            got = self._call(
                "POST",
                "/internal/complete-batch",
                CompleteBatchResponse,
                content=body,
                headers={LEASE_TOKENS_HEADER: tokens},
            )
        except ApiError as e:
            if e.status in (404, 405):
                self.batches = False  # an older API: one completion per task from now on
                return self._complete_batch(items)
            if _whole_batch_refused(e):
                # A refusal of the request as a whole (the gateway's body checks: a NUL or an
                # out-of-range number in one item's events or state, a body over the limit, a
                # task twice) is no item's answer: each is sent alone and answered for itself,
                # so one operator's bad report never fails its neighbours' attempts.
                return [_answer(lambda c=c, i=i: self._complete_one(c, i)) for c, i in items]
            raise
        _check_answers(len(got.results), len(items))
        return [r.response if r.response is not None else _item_error(r.error) for r in got.results]

    # -- the worker registry (dispatcher/fleet.py; worker/membership.py sends these) -------
    def register_worker(self, body: WorkerRegistration, timeout: float) -> WorkerBeat:
        return self._registry("register", body, timeout)

    def worker_beat(self, worker_id: str, timeout: float) -> WorkerBeat:
        return self._registry("beat", WorkerRef(worker_id=worker_id), timeout)

    def worker_stopped(self, worker_id: str, timeout: float) -> WorkerBeat:
        return self._registry("stop", WorkerRef(worker_id=worker_id), timeout)

    def _registry(self, call: str, body: BaseModel, timeout: float) -> WorkerBeat:
        """One try within `timeout`: the beat thread tries again at its next beat."""
        return self._call(
            "POST",
            f"/internal/workers/{call}",
            WorkerBeat,
            retries=0,
            content=body.model_dump_json(),
            timeout=timeout,
        )

    def close(self) -> None:
        self.http.close()
        if self.listener is not None:
            self.listener.close()


def complete_item(
    claim: Claim,
    outcome: str,
    *,
    error: str | None = None,
    retryable: bool = True,
    final_events: list[EventIn] | None = None,
    outputs: list[OutputCommit] | None = None,
    operator_state: dict[str, Any] | None = None,
    operator_state_revision: int = 0,
) -> CompleteItem:
    """The attempt's report, as one completion of a batch."""
    return CompleteItem(
        task_id=claim.task_id,
        attempt=claim.attempt,
        outcome=outcome,  # type: ignore[arg-type]
        error=error,
        retryable=retryable,
        final_events=final_events or [],
        outputs=outputs or [],
        operator_state=operator_state,
        operator_state_revision=operator_state_revision,
    )


def _oversize(item: CompleteItem) -> bool:
    return len(item.model_dump_json().encode()) > MAX_BATCHED_COMPLETION_BYTES  # bytes


def _raise_for_status(r: Response) -> None:
    """An HTTP error as ApiError, with the server's code and message when it sent them."""
    if r.status < 400:
        return
    try:
        body = json.loads(r.content)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ApiError(r.status, "error", r.text)
    raise ApiError(r.status, str(body.get("error", "error")), str(body.get("message", r.text)))


def _refuses_claim_keys(e: ApiError) -> bool:
    """An API from before claim keys: its 422 names the field as one it does not know."""
    return e.status == 422 and "claim_id" in e.message


def _check_answers(got: int, sent: int) -> None:
    """A batch answer holds one result per item sent, or it answers none of them."""
    if got != sent:
        raise ApiError(502, "bad_gateway", f"{sent} item(s) sent, {got} answered")


def _answer(call: Callable[[], T]) -> T | BaseException:
    """One call's result, or what it raised (a batch answers each item on its own)."""
    try:
        return call()
    except Exception as e:
        return e


def _whole_batch_refused(e: ApiError) -> bool:
    """A 4xx for the batch request itself that the items, sent one by one, may not share
    (not a missing or unauthenticated route: those every item would get alike)."""
    return 400 <= e.status < 500 and e.status not in (401, 404, 405)


def _item_error(error: BatchError | None) -> ApiError:
    if error is None:
        return ApiError(502, "bad_gateway", "the batch answer has neither a result nor an error")
    return ApiError(error.status, error.error, error.message)


def _lease(claim: Claim) -> dict[str, Any]:
    ref = LeaseRef(task_id=claim.task_id, attempt=claim.attempt, lease_token=claim.lease_token)
    return lease_params(ref)
