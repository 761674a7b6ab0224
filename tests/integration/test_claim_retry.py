"""A claim whose answer was lost: the worker retries the request with the same claim key
(`ClaimRequest.claim_id`), and gets the lease that request took instead of a 409, so the task
runs now instead of waiting, stranded, for its lease to run out. Anyone else, or any other
claim, is refused as before."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.integration.test_batches import new_tasks
from trace_platform.services import Services
from trace_platform.worker.client import DispatcherClient
from trace_platform.worker.http import Response, TransportError


def _status(services: Services, task_id: str) -> dict[str, Any]:
    with services.pool.connection() as conn:
        row = conn.execute(
            "SELECT status, attempt, lease_token::text, worker_id FROM task_status "
            "WHERE task_id = %s",
            [task_id],
        ).fetchone()
    assert row is not None
    return dict(row)


def _spoil_first_answer(
    client: DispatcherClient, path: str, spoil: Callable[[Response], Response]
) -> list[str]:
    """`client`'s first answer from `path`, after the API did the work, replaced by what
    `spoil` makes of it (or raises): the paths spoiled so far."""
    request = client.http.request
    spoiled: list[str] = []

    def spy(method: str, sent: str, **kw: Any) -> Response:
        answer = request(method, sent, **kw)
        if sent == path and not spoiled:
            spoiled.append(sent)
            return spoil(answer)
        return answer

    client.http.request = spy  # type: ignore[method-assign]
    return spoiled


@pytest.mark.parametrize(
    "route", ["/internal/claim", "/internal/claim-batch", "/internal/exchange"]
)
def test_a_retried_claim_gets_the_lease_its_first_try_took(
    api: httpx.Client, services: Services, route: str
) -> None:
    task_id, other = new_tasks(services, 2)
    key = str(uuid.uuid4())

    def claim(task: str, worker: str, claim_id: str | None) -> dict[str, Any]:
        one = {"task_id": task, "worker_id": worker, "claim_id": claim_id}
        if route == "/internal/claim":
            r = api.post(route, json=one)
            return r.json() if r.status_code == 200 else {"error": r.json()}
        # A batch of two (the batch statement's path), the other task claimed alongside.
        mate = {"task_id": other, "worker_id": "mate"}
        r = api.post(route, json={"claims": [one, mate]})
        assert r.status_code == 200, r.text
        got = r.json()["results" if route.endswith("batch") else "claims"][0]
        return got["claim"] if got["claim"] is not None else {"error": got["error"]}

    first = claim(task_id, "w1", key)
    assert first["attempt"] == 1 and first["lease_token"] == key
    assert _status(services, task_id) == {
        "status": "running",
        "attempt": 1,
        "lease_token": key,
        "worker_id": "w1",
    }
    again = claim(task_id, "w1", key)
    assert again["attempt"] == 1 and again["lease_token"] == key
    assert again["task"]["status"] == "running" and again["task"]["task_id"] == task_id
    # Another claim of the running task (another key, no key, another worker): refused.
    for worker, claim_id in [("w1", str(uuid.uuid4())), ("w1", None), ("w2", key)]:
        refused = claim(task_id, worker, claim_id)
        assert refused["error"]["error"] == "not_claimable", refused
    assert _status(services, task_id)["attempt"] == 1  # nothing above opened an attempt
    # Once the attempt ended, the retry is refused too.
    done = {"outcome": "succeeded"}
    r = api.post(
        "/internal/task-complete",
        params={"task_id": task_id, "attempt": 1},
        headers={"X-Lease-Token": key},
        json=done,
    )
    assert r.status_code == 200, r.text
    assert claim(task_id, "w1", key)["error"]["error"] == "not_claimable"


def test_the_worker_client_runs_a_task_whose_claim_answer_was_lost(
    client: DispatcherClient, services: Services
) -> None:
    """The claim reaches the API and commits, its answer never reaches the worker (a dropped
    connection): the client's retry is answered with that claim, and the task is the
    worker's to run, attempt 1, not a 409 leaving it stranded until its lease runs out."""
    (task_id,) = new_tasks(services, 1)

    def lost(answer: Response) -> Response:
        raise TransportError("connection reset before the answer was read")

    lost_paths = _spoil_first_answer(client, "/internal/claim", lost)
    got = client.claim(uuid.UUID(task_id), "w1")
    assert lost_paths == ["/internal/claim"]
    assert got.attempt == 1 and got.task is not None and got.task.status == "running"
    st = _status(services, task_id)
    assert st["status"] == "running" and st["attempt"] == 1
    assert st["lease_token"] == str(got.lease_token)
    assert client.complete(got, "succeeded").status == "succeeded"


@pytest.mark.parametrize(
    "key", ["00000000-0000-0000-0000-000000000000", str(uuid.uuid1())], ids=["nil", "uuid1"]
)
def test_a_claim_key_that_is_not_random_is_refused(
    api: httpx.Client, services: Services, key: str
) -> None:
    """The key becomes the lease token: a nil or time-based UUID is not a secret."""
    (task_id,) = new_tasks(services, 1)
    r = api.post("/internal/claim", json={"task_id": task_id, "worker_id": "w", "claim_id": key})
    assert r.status_code == 422 and "claim_id" in r.json()["message"], r.text
    assert _status(services, task_id)["status"] == "queued"


def test_a_retry_renews_a_lease_that_ran_on_while_its_answer_was_lost(
    api: httpx.Client, services: Services
) -> None:
    (task_id,) = new_tasks(services, 1)
    key = str(uuid.uuid4())
    body = {"task_id": task_id, "worker_id": "w1", "claim_id": key}
    assert api.post("/internal/claim", json=body).status_code == 200
    with services.pool.connection() as conn:
        conn.execute(
            "UPDATE task_status SET lease_until = now() - interval '1 second' WHERE task_id = %s",
            [task_id],
        )
    again = api.post("/internal/claim", json=body).json()
    with services.pool.connection() as conn:
        row = conn.execute(
            "SELECT lease_until > now() AS held, lease_until FROM task_status WHERE task_id = %s",
            [task_id],
        ).fetchone()
    assert row is not None and row["held"], row
    answered = datetime.fromisoformat(again["lease_until"].replace("Z", "+00:00"))
    assert again["attempt"] == 1 and answered == row["lease_until"]


def test_a_client_claims_from_an_api_that_knows_no_claim_key(
    client: DispatcherClient, services: Services
) -> None:
    """An API from before claim keys refuses the field (422): the client claims without it
    from then on, as it falls back from the batch routes on an older API."""
    ids = new_tasks(services, 2)
    request = client.http.request
    sent: list[bytes] = []

    def older_api(method: str, path: str, **kw: Any) -> Response:
        body = kw.get("content") or b""
        body = body.encode() if isinstance(body, str) else body
        sent.append(body)
        if b"claim_id" in body:
            return Response(
                422,
                b'{"error": "invalid_request", "message": '
                b'"body.claim_id: Extra inputs are not permitted"}',
            )
        return request(method, path, **kw)

    client.http.request = older_api  # type: ignore[method-assign]
    first = client.claim(uuid.UUID(ids[0]), "w1")
    second = client.claim(uuid.UUID(ids[1]), "w1")
    assert first.attempt == 1 and second.attempt == 1 and not client.claim_keys
    assert [b"claim_id" in b for b in sent] == [True, False, False]
