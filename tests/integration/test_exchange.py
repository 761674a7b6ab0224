"""`/internal/exchange`: a worker's completions and its next claims in one request, over a real
socket. Each item is answered as its batch route would answer it (a refusal its own, committing
nothing); the plain ones land in one transaction; a bad exchange is a clear 422; the worker's
client sends both kinds together and falls back when the API has no exchange."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.test_batches import claim_batch, new_tasks
from tests.support.batching import one_batch
from trace_platform.api.exchange_listener import ExchangeListener
from trace_platform.contract import MAX_BATCH, ClaimRequest, CompleteItem
from trace_platform.services import Services
from trace_platform.worker.client import DispatcherClient
from trace_platform.worker.http import Response


@pytest.fixture(params=["route", "listener"])
def ex(
    request: pytest.FixtureRequest, api: httpx.Client, services: Services
) -> Iterator[httpx.Client]:
    """Where the exchanges go: the API's route, or its listener (api/exchange_listener.py),
    which must answer every one of these tests alike."""
    if request.param == "route":
        yield api
        return
    listener = ExchangeListener(
        services.dispatcher, services.internal_token or "", "127.0.0.1", 0
    ).start()
    headers = {"X-Internal-Token": services.internal_token or ""}
    url = f"http://127.0.0.1:{listener.port}"
    with httpx.Client(base_url=url, timeout=10, headers=headers) as client:
        yield client
    listener.stop()


def exchange(
    api: httpx.Client,
    completions: list[dict[str, Any]],
    claims: list[str],
    tokens: list[str] | None,
) -> httpx.Response:
    body = {
        "completions": completions,
        "claims": [{"task_id": t, "worker_id": f"x{i}"} for i, t in enumerate(claims)],
    }
    headers = {} if tokens is None else {"X-Lease-Tokens": ",".join(tokens)}
    return api.post("/internal/exchange", json=body, headers=headers)


def rows(services: Services, ids: list[str]) -> dict[str, dict[str, Any]]:
    with services.pool.connection() as conn:
        got = conn.execute(
            "SELECT task_id::text, status, started_at, finished_at, worker_id FROM task_status "
            "WHERE task_id = ANY(%s::uuid[])",
            [ids],
        ).fetchall()
    return {r["task_id"]: r for r in got}


def test_an_exchange_completes_then_claims_each_item_answered_for_itself(
    api: httpx.Client, ex: httpx.Client, services: Services
) -> None:
    running = [r["claim"] for r in claim_batch(api, new_tasks(services, 4))]
    items = [
        {"task_id": c["task_id"], "attempt": c["attempt"], "outcome": "succeeded"} for c in running
    ]
    items[2] = {**items[2], "outcome": "failed", "error": "boom", "retryable": False}
    tokens = [c["lease_token"] for c in running]
    tokens[3] = str(uuid.uuid4())  # wrong lease: refused alone
    fresh = new_tasks(services, 2)
    unknown = str(uuid.uuid4())
    r = exchange(ex, items, [*fresh, unknown], tokens)
    assert r.status_code == 200, r.text
    got = r.json()
    assert [x["task_id"] for x in got["completions"]] == [c["task_id"] for c in running]
    assert [x["response"]["status"] for x in got["completions"][:3]] == [
        "succeeded",
        "succeeded",
        "failed",
    ]
    assert got["completions"][3]["error"]["error"] == "wrong_lease"
    assert [x["task_id"] for x in got["claims"]] == [*fresh, unknown]
    claims = [x["claim"] for x in got["claims"][:2]]
    assert all(c["attempt"] == 1 and c["task"]["status"] == "running" for c in claims)
    assert got["claims"][2]["error"]["status"] == 404
    assert str(uuid.uuid4()) not in r.text and tokens[0] not in r.text  # no token echoed

    state = rows(services, [c["task_id"] for c in running] + fresh)
    done, claimed = state[running[0]["task_id"]], state[fresh[0]]
    assert [state[c["task_id"]]["status"] for c in running] == [
        "succeeded",
        "succeeded",
        "failed",
        "running",  # its wrong-lease report landed nothing
    ]
    assert [state[t]["worker_id"] for t in fresh] == ["x0", "x1"]
    # The plain completions and the plain claims share one transaction (now() is its start).
    assert done["finished_at"] == claimed["started_at"] == state[fresh[1]]["started_at"]
    # Claimed, each fresh task is no longer claimable; its lease answers a completion.
    again = exchange(ex, [], fresh, None).json()["claims"]
    assert all(x["error"]["error"] == "not_claimable" for x in again)
    fin = [{"task_id": c["task_id"], "attempt": 1, "outcome": "succeeded"} for c in claims]
    r = exchange(ex, fin, [], [c["lease_token"] for c in claims])
    assert [x["response"]["status"] for x in r.json()["completions"]] == ["succeeded"] * 2


def test_an_exchange_needs_the_internal_token(
    api: httpx.Client, ex: httpx.Client, services: Services
) -> None:
    """Refused unread without it (user keys included), as every /internal/* route."""
    (c,) = [r["claim"] for r in claim_batch(api, new_tasks(services, 1))]
    (fresh,) = new_tasks(services, 1)
    item = {"task_id": c["task_id"], "attempt": 1, "outcome": "succeeded"}
    body = {"completions": [item], "claims": [{"task_id": fresh, "worker_id": "x"}]}
    for headers in ({"X-Internal-Token": "guess"}, {"Authorization": "Bearer guess"}, {}):
        with httpx.Client(base_url=ex.base_url, timeout=10) as caller:  # not the API's token
            r = caller.post(
                "/internal/exchange",
                json=body,
                headers={**headers, "X-Lease-Tokens": c["lease_token"]},
            )
        assert r.status_code == 401, r.text
    state = rows(services, [c["task_id"], fresh])
    assert state[c["task_id"]]["status"] == "running" and state[fresh]["status"] == "queued"


def test_a_claim_after_its_own_completion_in_one_exchange_is_not_claimable(
    api: httpx.Client, ex: httpx.Client, services: Services
) -> None:
    """A late second wake-up of a task riding with that task's completion: the completion lands
    first, so the claim is the usual 409 (dropped by the worker), never a second attempt."""
    (c,) = [r["claim"] for r in claim_batch(api, new_tasks(services, 1))]
    item = {"task_id": c["task_id"], "attempt": 1, "outcome": "succeeded"}
    r = exchange(ex, [item], [c["task_id"]], [c["lease_token"]])
    got = r.json()
    assert got["completions"][0]["response"]["status"] == "succeeded"
    assert got["claims"][0]["error"]["status"] == 409
    assert rows(services, [c["task_id"]])[c["task_id"]]["status"] == "succeeded"


@pytest.mark.parametrize(
    "case",
    ["empty", "no tokens header", "tokens without completions", "a claim twice", "too many claims"],
)
def test_a_bad_exchange_is_a_clear_422_and_changes_nothing(
    api: httpx.Client, ex: httpx.Client, services: Services, case: str
) -> None:
    running = [r["claim"] for r in claim_batch(api, new_tasks(services, 1))]
    items = [{"task_id": c["task_id"], "attempt": 1, "outcome": "succeeded"} for c in running]
    tokens: list[str] | None = [c["lease_token"] for c in running]
    (fresh,) = new_tasks(services, 1)
    claims = [fresh]
    if case == "empty":
        items, claims, tokens = [], [], None
    elif case == "no tokens header":
        tokens = None
    elif case == "tokens without completions":
        items = []
    elif case == "a claim twice":
        claims = [fresh, fresh]
    else:
        claims = [str(uuid.uuid4()) for _ in range(MAX_BATCH + 1)]
    r = exchange(ex, items, claims, tokens)
    assert r.status_code == 422, r.text
    message = r.json()["message"]
    expected = {
        "empty": "at least one completion or claim",
        "no tokens header": "X-Lease-Tokens holds 0 token(s); the body has 1",
        "tokens without completions": "X-Lease-Tokens holds 1 token(s); the body has 0",
        "a claim twice": "appears twice in one claim batch",
        "too many claims": "claims",
    }[case]
    assert expected in message, message
    state = rows(services, [running[0]["task_id"], fresh])
    assert state[running[0]["task_id"]]["status"] == "running"
    assert state[fresh]["status"] == "queued"


def _sent(client: DispatcherClient, refuse: str | None = None) -> list[str]:
    """The paths `client` requests from now on; `refuse`: a path answered 404 (an older API)."""
    paths: list[str] = []
    request = client.http.request

    def spy(method: str, path: str, **kw: Any) -> Response:
        paths.append(path)
        if path == refuse:
            return Response(404, b'{"error": "not_found", "message": "Not Found"}')
        return request(method, path, **kw)

    client.http.request = spy  # type: ignore[method-assign]
    return paths


def _together(client: DispatcherClient, calls: list[Any]) -> list[Any]:
    """`calls` from as many threads, held until all wait, so they leave in one batch."""
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except Exception as e:
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    with one_batch(client._exchange, len(calls)):
        for t in threads:
            t.start()
    for t in threads:
        t.join(30)
    return out


@pytest.mark.parametrize("older_api", [False, True])
def test_the_client_sends_a_workers_claims_and_completions_in_one_exchange(
    client: DispatcherClient, services: Services, older_api: bool
) -> None:
    ids = [uuid.UUID(t) for t in new_tasks(services, 4)]
    running = [client.claim(t, "w") for t in ids[:2]]
    paths = _sent(client, refuse="/internal/exchange" if older_api else None)
    calls = [
        *[lambda c=c: client.complete(c, "succeeded") for c in running],
        *[lambda t=t: client.claim(t, "w") for t in ids[2:]],
    ]
    got = _together(client, calls)
    assert [g.status for g in got[:2]] == ["succeeded", "succeeded"], got
    assert [g.task_id for g in got[2:]] == ids[2:] and all(g.attempt == 1 for g in got[2:])
    if older_api:  # answered 404 once, then claims and completions apart from now on
        assert paths[0] == "/internal/exchange" and not client.exchanges
        assert sorted(paths[1:]) == ["/internal/claim-batch", "/internal/complete-batch"]
    else:
        assert paths == ["/internal/exchange"]
    state = rows(services, [str(t) for t in ids])
    assert [state[str(t)]["status"] for t in ids] == ["succeeded"] * 2 + ["running"] * 2


def test_a_completion_the_api_refuses_as_a_body_does_not_fail_the_claims_beside_it(
    client: DispatcherClient, services: Services
) -> None:
    """The gateway refuses the whole exchange for one completion's NUL: the claims beside it
    are still claimed, and the poisoned report is refused for itself."""
    ids = [uuid.UUID(t) for t in new_tasks(services, 3)]
    (running,) = [client.claim(ids[0], "w")]
    poisoned = CompleteItem(
        task_id=running.task_id,
        attempt=running.attempt,
        outcome="failed",
        error="a\x00b",
        retryable=False,
    )
    paths = _sent(client)
    calls = [
        lambda: client._exchange.submit((running, poisoned)),
        *[
            lambda t=t: client._exchange.submit(ClaimRequest(task_id=t, worker_id="w"))
            for t in ids[1:]
        ],
    ]
    got = _together(client, calls)
    assert paths[0] == "/internal/exchange"
    assert [g.task_id for g in got[1:]] == ids[1:], got
    assert isinstance(got[0], Exception) and "422" in str(got[0]), got
    state = rows(services, [str(t) for t in ids])
    assert [state[str(t)]["status"] for t in ids] == ["running"] * 3


def test_a_fault_in_the_claims_half_does_not_fail_the_completions(
    api: httpx.Client, ex: httpx.Client, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trace_platform.dispatcher.lifecycle import Lifecycle

    running = [r["claim"] for r in claim_batch(api, new_tasks(services, 2))]
    good, bad = new_tasks(services, 2)
    build = Lifecycle._payload_of

    def faulty(self: Any, tx: Any, view: Any, *a: Any, **k: Any) -> Any:
        if str(view["task_id"]) == bad:
            raise RuntimeError("a bug while building one claim's payload")
        return build(self, tx, view, *a, **k)

    monkeypatch.setattr(Lifecycle, "_payload_of", faulty)
    items = [{"task_id": c["task_id"], "attempt": 1, "outcome": "succeeded"} for c in running]
    r = exchange(ex, items, [good, bad], [c["lease_token"] for c in running])
    assert r.status_code == 200, r.text
    got = r.json()
    assert [x["response"]["status"] for x in got["completions"]] == ["succeeded"] * 2
    assert got["claims"][0]["claim"]["attempt"] == 1
    assert got["claims"][1]["error"]["status"] == 500 and "a bug" not in r.text
    state = rows(services, [c["task_id"] for c in running] + [good, bad])
    assert [state[c["task_id"]]["status"] for c in running] == ["succeeded"] * 2
    assert state[good]["status"] == "running" and state[bad]["status"] == "queued"


def test_reports_with_more_than_their_success_land_before_the_claims_are_leased(
    api: httpx.Client, ex: httpx.Client, services: Services
) -> None:
    """A failure report (the full path) is done before the shared transaction starts, so no
    claim's lease runs while it is written; the plain ones share the claims' commit."""
    plain, failed = [r["claim"] for r in claim_batch(api, new_tasks(services, 2))]
    (fresh,) = new_tasks(services, 1)
    items = [
        {"task_id": plain["task_id"], "attempt": 1, "outcome": "succeeded"},
        {"task_id": failed["task_id"], "attempt": 1, "outcome": "failed", "error": "boom"},
    ]
    r = exchange(ex, items, [fresh], [plain["lease_token"], failed["lease_token"]])
    got = r.json()
    assert [x["task_id"] for x in got["completions"]] == [plain["task_id"], failed["task_id"]]
    assert got["completions"][1]["response"]["status"] in ("queued", "failed")
    state = rows(services, [plain["task_id"], failed["task_id"], fresh])
    assert state[fresh]["status"] == "running"
    with services.pool.connection() as conn:
        ended = conn.execute(
            "SELECT finished_at FROM task_attempts WHERE task_id = %s AND attempt = 1",
            [failed["task_id"]],
        ).fetchone()
    assert ended is not None and ended["finished_at"] < state[fresh]["started_at"]
    assert state[plain["task_id"]]["finished_at"] == state[fresh]["started_at"]


def test_an_answer_short_of_its_items_fails_them_all_clearly(
    client: DispatcherClient, services: Services
) -> None:
    ids = [uuid.UUID(t) for t in new_tasks(services, 2)]
    request = client.http.request

    def truncate(method: str, path: str, **kw: Any) -> Response:
        answer = request(method, path, **kw)
        doc = json.loads(answer.content)
        doc["results"] = doc["results"][:1]
        return Response(answer.status, json.dumps(doc).encode())

    client.http.request = truncate  # type: ignore[method-assign]
    got = _together(client, [lambda t=t: client.claim(t, "w") for t in ids])
    assert all(isinstance(g, Exception) and "2 item(s) sent, 1 answered" in str(g) for g in got)
