"""`/internal/claim-batch` and `/internal/complete-batch` over a real socket: each item answered
as its one-task call would, fenced by its own attempt and lease token (tokens in the
X-Lease-Tokens header only), a refused item committing nothing; bad batches a clear 422."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.integration.test_api import snapshot
from trace_platform.contract import TaskSpec
from trace_platform.dispatcher.lifecycle import Lifecycle
from trace_platform.services import Services


def new_tasks(services: Services, n: int) -> list[str]:
    return [
        str(services.dispatcher.create_task(TaskSpec(job="j", operator="noop")).task_id)
        for _ in range(n)
    ]


def claim_batch(api: httpx.Client, task_ids: list[str]) -> list[dict[str, Any]]:
    claims = [{"task_id": t, "worker_id": f"w{i}"} for i, t in enumerate(task_ids)]
    r = api.post("/internal/claim-batch", json={"claims": claims})
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    assert [x["task_id"] for x in results] == task_ids  # in the body's order
    return results


def complete_batch(
    api: httpx.Client, items: list[dict[str, Any]], tokens: list[str]
) -> httpx.Response:
    return api.post(
        "/internal/complete-batch",
        json={"completions": items},
        headers={"X-Lease-Tokens": ",".join(tokens)},
    )


def test_a_batch_claims_and_completes_each_task(api: httpx.Client, services: Services) -> None:
    ids = new_tasks(services, 3)
    unknown = str(uuid.uuid4())
    results = claim_batch(api, [*ids, unknown])
    claims = [r["claim"] for r in results[:3]]
    assert all(c and c["attempt"] == 1 and c["task"]["status"] == "running" for c in claims)
    assert results[3]["claim"] is None and results[3]["error"]["status"] == 404
    # Each claim is its own worker's, and a second claim of the same tasks is refused.
    with services.pool.connection() as conn:
        rows = conn.execute(
            "SELECT task_id::text, worker_id FROM task_status WHERE task_id = ANY(%s::uuid[])",
            [ids],
        ).fetchall()
    assert {r["task_id"]: r["worker_id"] for r in rows} == {t: f"w{i}" for i, t in enumerate(ids)}
    again = claim_batch(api, ids)
    assert all(r["error"]["error"] == "not_claimable" for r in again)

    items = [
        {"task_id": c["task_id"], "attempt": c["attempt"], "outcome": "succeeded"} for c in claims
    ]
    items[2] = {**items[2], "outcome": "failed", "error": "boom", "retryable": False}
    r = complete_batch(api, items, [c["lease_token"] for c in claims])
    assert r.status_code == 200, r.text
    got = [x["response"]["status"] for x in r.json()["results"]]
    assert got == ["succeeded", "succeeded", "failed"]
    # The same report again is idempotent, as on /internal/task-complete.
    r = complete_batch(api, items[:2], [c["lease_token"] for c in claims[:2]])
    assert [x["response"]["status"] for x in r.json()["results"]] == ["succeeded", "succeeded"]


def test_a_stale_or_wrong_lease_is_refused_alone_and_commits_nothing(
    api: httpx.Client, services: Services
) -> None:
    ids = new_tasks(services, 3)
    claims = [r["claim"] for r in claim_batch(api, ids)]
    items = [
        {"task_id": c["task_id"], "attempt": c["attempt"], "outcome": "succeeded"} for c in claims
    ]
    items[1] = {**items[1], "attempt": 2}  # stale (a later attempt than the task's)
    tokens = [c["lease_token"] for c in claims]
    tokens[2] = str(uuid.uuid4())  # wrong lease
    r = complete_batch(api, items, tokens)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert results[0]["response"]["status"] == "succeeded"
    assert results[1]["error"]["status"] == 409 and results[1]["error"]["error"] == "stale_attempt"
    assert results[2]["error"]["status"] == 409 and results[2]["error"]["error"] == "wrong_lease"
    with services.pool.connection() as conn:
        rows = conn.execute(
            "SELECT task_id::text, status FROM task_status WHERE task_id = ANY(%s::uuid[])", [ids]
        ).fetchall()
    assert {r["task_id"]: r["status"] for r in rows} == {
        ids[0]: "succeeded",
        ids[1]: "running",
        ids[2]: "running",
    }


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("fewer tokens", "invalid"),
        ("not a uuid", "invalid"),
        ("token in the body", "invalid_request"),
        ("no tokens header", "invalid_request"),
        ("twice the same task", "invalid"),
        ("empty", "invalid_request"),
    ],
)
def test_a_bad_complete_batch_is_a_clear_422_and_changes_nothing(
    api: httpx.Client, services: Services, case: str, code: str
) -> None:
    claims = [r["claim"] for r in claim_batch(api, new_tasks(services, 2))]
    items = [
        {"task_id": c["task_id"], "attempt": c["attempt"], "outcome": "succeeded"} for c in claims
    ]
    tokens = [c["lease_token"] for c in claims]
    headers: dict[str, str] = {}
    if case == "fewer tokens":
        tokens = tokens[:1]
    elif case == "not a uuid":
        tokens[1] = "nope"
    elif case == "token in the body":
        items[0] = {**items[0], "lease_token": tokens[0]}
    elif case == "twice the same task":
        items, tokens = [items[0], items[0]], [tokens[0], tokens[0]]
    elif case == "empty":
        items, tokens = [], []
    before = snapshot(services)
    if case == "no tokens header":
        r = api.post("/internal/complete-batch", json={"completions": items}, headers=headers)
    else:
        r = complete_batch(api, items, tokens)
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["error"] == code and err["message"]
    for token in tokens:  # a refusal never echoes a lease token
        assert token not in r.text
    assert snapshot(services) == before


def test_a_bad_claim_batch_is_a_clear_422(api: httpx.Client, services: Services) -> None:
    (task_id,) = new_tasks(services, 1)
    for body in (
        {"claims": []},
        {"claims": [{"task_id": task_id, "worker_id": "w"}] * 2},
        {"claims": [{"task_id": "nope", "worker_id": "w"}]},
        {"claims": [{"task_id": task_id, "worker_id": "w"}] * 101},
    ):
        before = snapshot(services)
        r = api.post("/internal/claim-batch", json=body)
        assert r.status_code == 422, r.text
        assert r.json()["message"]
        assert snapshot(services) == before


def test_batches_need_the_internal_token(api: httpx.Client, services: Services) -> None:
    (task_id,) = new_tasks(services, 1)
    body = {"claims": [{"task_id": task_id, "worker_id": "w"}]}
    no_token = {"X-Internal-Token": "guess"}
    r = api.post("/internal/claim-batch", json=body, headers=no_token)
    assert r.status_code == 401
    r = api.post("/internal/complete-batch", json={"completions": []}, headers=no_token)
    assert r.status_code == 401


def test_a_server_fault_on_one_item_answers_for_it_alone(
    api: httpx.Client, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = new_tasks(services, 3)
    claims = [r["claim"] for r in claim_batch(api, ids)]
    full = Lifecycle._complete_full

    def faulty(self: Any, req: Any) -> Any:
        if str(req.task_id) == ids[1]:
            raise RuntimeError("a bug, or a lost connection")
        return full(self, req)

    monkeypatch.setattr(Lifecycle, "_complete_full", faulty)
    # The faulty one goes the full way (a failure report); the others are plain successes.
    items = [
        {"task_id": c["task_id"], "attempt": c["attempt"], "outcome": "succeeded"} for c in claims
    ]
    items[1] = {**items[1], "outcome": "failed", "error": "boom", "retryable": False}
    r = complete_batch(api, items, [c["lease_token"] for c in claims])
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert results[1]["error"]["status"] == 500 and results[1]["error"]["error"] == "internal"
    assert "lost connection" not in r.text  # the fault is logged, not sent
    assert [results[i]["response"]["status"] for i in (0, 2)] == ["succeeded", "succeeded"]
    with services.pool.connection() as conn:
        rows = conn.execute(
            "SELECT task_id::text, status FROM task_status WHERE task_id = ANY(%s::uuid[])",
            [ids],
        ).fetchall()
    assert {r["task_id"]: r["status"] for r in rows} == {
        ids[0]: "succeeded",
        ids[1]: "running",  # nothing of the faulty report landed: it may be sent again
        ids[2]: "succeeded",
    }
