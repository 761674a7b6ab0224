"""The HTTP API over a real socket: shapes, status codes, and bad input that changes nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from tests.support.wire import fenced
from trace_platform.config import Settings
from trace_platform.contract import DatasetRef, TaskSpec
from trace_platform.db.embedded import free_port
from trace_platform.lite.stack import ApiServer
from trace_platform.services import Services


def snapshot(services: Services) -> dict[str, Any]:
    with services.pool.connection() as conn:
        return {
            t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
            for t in (
                "task_status",
                "task_attempts",
                "events",
                "outbox",
                "queue_messages",
                "queue_leases",
            )
        }


OUT = str(uuid.uuid4())  # the one dataset the ad-hoc test task produces


def running_task(api: httpx.Client, outputs: list[str] | None = None) -> dict[str, Any]:
    """A claimed task producing `outputs` (made the way a DAG's event makes it: ad-hoc tasks
    from /v1/tasks have no outputs)."""
    services: Services = api.services  # type: ignore[attr-defined]
    spec = TaskSpec(
        job="j",
        operator="noop",
        outputs=[DatasetRef(dataset_uuid=o) for o in ([OUT] if outputs is None else outputs)],
    )
    task_id = str(services.dispatcher.create_task(spec).task_id)
    claim = api.post("/internal/claim", json={"task_id": task_id, "worker_id": "w"})
    assert claim.status_code == 200, claim.text
    return claim.json()


def lease(claim: dict[str, Any]) -> dict[str, Any]:
    return {k: claim[k] for k in ("task_id", "attempt", "lease_token")}


def test_happy_path_over_http(api: httpx.Client) -> None:
    assert api.get("/healthz").json()["ok"] is True
    c = running_task(api)
    fetched = api.get(
        "/internal/task-fetch",
        params={"task_id": c["task_id"], "attempt": c["attempt"]},
        headers={"X-Lease-Token": c["lease_token"]},
    )
    assert fetched.status_code == 200 and fetched.json()["operator"] == "noop"
    assert c["task"] == fetched.json()  # the claim carried the payload already
    hb = api.post("/internal/heartbeat", **fenced({**lease(c), "progress": {"done": 0.5}}))
    assert hb.status_code == 200 and hb.json()["cancel_requested"] is False
    ds = OUT
    ev = api.post(
        "/internal/events", **fenced({**lease(c), "events": [{"dataset_uuid": ds, "cursor": "1"}]})
    )
    assert ev.json()["accepted"] == 1
    done = api.post(
        "/internal/task-complete",
        **fenced(
            {
                **lease(c),
                "outcome": "succeeded",
                "final_events": [{"dataset_uuid": ds, "cursor": "2"}],
            }
        ),
    )
    assert done.status_code == 200 and done.json()["status"] == "succeeded"
    view = api.get(f"/v1/tasks/{c['task_id']}").json()
    assert view["status"] == "succeeded" and view["events"] == 2 and len(view["attempts"]) == 1
    assert api.post(f"/v1/tasks/{c['task_id']}/cancel").status_code == 409


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("GET", "/v1/tasks/{unknown}", None, 404, "not_found"),
        ("POST", "/v1/tasks/{unknown}/cancel", None, 404, "not_found"),
        ("GET", "/v1/tasks/not-a-uuid", None, 422, "invalid_request"),
        ("POST", "/internal/claim", {"task_id": "{unknown}", "worker_id": "w"}, 404, "not_found"),
        (
            "POST",
            "/internal/heartbeat",
            {"task_id": "{unknown}", "attempt": 1, "lease_token": "{unknown}"},
            404,
            "not_found",
        ),
        ("POST", "/internal/heartbeat", "{lease_wrong_token}", 409, "wrong_lease"),
        ("POST", "/internal/heartbeat", "{lease_stale}", 409, "stale_attempt"),
        ("POST", "/internal/task-complete", "{complete_wrong_token}", 409, "wrong_lease"),
        ("POST", "/internal/task-complete", "{complete_bad_outcome}", 422, "invalid_request"),
        # Only a success lands events, outputs or state: a failure's (a late one's, after the
        # reaper, would pass none of the guards a success passes) is refused.
        ("POST", "/internal/task-complete", "{failed_with_output}", 422, "invalid_request"),
        ("POST", "/internal/task-complete", "{failed_with_event}", 422, "invalid_request"),
        ("POST", "/internal/task-complete", "{canceled_with_state}", 422, "invalid_request"),
        ("POST", "/internal/task-complete", "{released_with_event}", 422, "invalid_request"),
        ("POST", "/internal/events", "{events_two_identities}", 422, "invalid_request"),
        ("POST", "/internal/events", "{events_empty}", 422, "invalid_request"),
        (
            "POST",
            "/v1/tasks",
            {"job": "j", "operator": "noop", "runtime": "docker"},
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/tasks",
            {"job": "j", "operator": "noop", "surprise": 1},
            422,
            "invalid_request",
        ),
    ],
)
def test_bad_input_gets_clear_error_and_changes_nothing(
    api: httpx.Client, services: Services, method: str, path: str, body: Any, status: int, code: str
) -> None:
    c = running_task(api)
    unknown = str(uuid.uuid4())
    bodies: dict[str, Any] = {
        "{lease_wrong_token}": {**lease(c), "lease_token": unknown},
        "{lease_stale}": {**lease(c), "attempt": 2},
        "{complete_wrong_token}": {**lease(c), "lease_token": unknown, "outcome": "succeeded"},
        "{complete_bad_outcome}": {**lease(c), "outcome": "kinda"},
        "{failed_with_output}": {
            **lease(c),
            "outcome": "failed",
            "outputs": [{"dataset_uuid": OUT, "partition_key": "p"}],
        },
        "{failed_with_event}": {
            **lease(c),
            "outcome": "failed",
            "final_events": [{"dataset_uuid": OUT, "cursor": "1"}],
        },
        "{canceled_with_state}": {**lease(c), "outcome": "canceled", "operator_state": {"n": 1}},
        "{released_with_event}": {
            **lease(c),
            "outcome": "released",
            "final_events": [{"dataset_uuid": OUT, "cursor": "1"}],
        },
        "{events_two_identities}": {
            **lease(c),
            "events": [{"dataset_uuid": unknown, "cursor": "1", "partition_key": "p"}],
        },
        "{events_empty}": {**lease(c), "events": []},
    }
    named = body if isinstance(body, str) else ""
    if isinstance(body, str):
        body = bodies[body]
    elif isinstance(body, dict):
        body = json.loads(json.dumps(body).replace("{unknown}", unknown))
    before = snapshot(services)
    url = path.replace("{unknown}", unknown)
    if path.startswith("/internal/") and path != "/internal/claim":
        r = api.request(method, url, **fenced(body))
    else:
        r = api.request(method, url, json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["error"] == code and err["message"]
    if "_with_" in named:
        assert "carries no events, outputs or state" in err["message"], err
    assert snapshot(services) == before


def test_malformed_json_is_422_and_changes_nothing(api: httpx.Client, services: Services) -> None:
    running_task(api)
    before = snapshot(services)
    r = api.post(
        "/internal/task-complete",
        content=b'{"task_id": ',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 422
    assert "JSON" in r.json()["message"]
    assert snapshot(services) == before


def test_oversized_body_is_413_and_changes_nothing(api: httpx.Client, services: Services) -> None:
    c = running_task(api)
    before = snapshot(services)
    huge = {**lease(c), "outcome": "failed", "error": "x" * (3 * 1024 * 1024)}
    r = api.post("/internal/task-complete", **fenced(huge))
    assert r.status_code == 413 and "limit" in r.json()["message"]
    assert snapshot(services) == before


def test_internal_token_guards_internal_endpoints(settings: Settings, dsn: str) -> None:
    secured = Services.build(
        settings.model_copy(update={"internal_token": SecretStr("s3cret")}), dsn
    )
    server = ApiServer(secured, "127.0.0.1", free_port(), background=False)
    server.start()
    try:
        task = secured.dispatcher.create_task(TaskSpec(job="victim", operator="noop"))
        body = {"task_id": str(task.task_id), "worker_id": "attacker"}
        for headers in (
            {},
            {"X-Internal-Token": "guess"},
            {"Authorization": "Bearer s3cret"},  # an API-key header is not the credential
        ):
            r = httpx.post(f"{server.url}/internal/claim", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        for path in ("/internal/task-fetch", "/internal/task-secrets"):
            r = httpx.get(
                f"{server.url}{path}",
                params={"task_id": str(task.task_id), "attempt": 1},
                headers={"X-Lease-Token": str(uuid.uuid4())},
            )
            assert r.status_code == 401
        assert secured.dispatcher.get_task(task.task_id).status == "queued"  # untouched
        ok = httpx.post(
            f"{server.url}/internal/claim", json=body, headers={"X-Internal-Token": "s3cret"}
        )
        assert ok.status_code == 200  # past the guard
    finally:
        server.stop()
        secured.close()


def test_lite_generates_a_private_internal_token(services: Services) -> None:
    token_file = services.settings.home / "internal.token"
    assert services.internal_token and token_file.read_text().strip() == services.internal_token
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert services.settings.home.stat().st_mode & 0o777 == 0o711


@pytest.mark.parametrize("outputs", [[], [str(uuid.uuid4())]])
def test_events_only_for_the_tasks_own_outputs(
    api: httpx.Client, services: Services, outputs: list[str]
) -> None:
    c = running_task(api, outputs)
    other_dag_dataset = str(uuid.uuid4())
    before = snapshot(services)
    r = api.post(
        "/internal/events",
        **fenced({**lease(c), "events": [{"dataset_uuid": other_dag_dataset, "cursor": "1"}]}),
    )
    assert r.status_code == 403 and r.json()["error"] == "forbidden"
    assert other_dag_dataset in r.json()["message"]
    done = api.post(
        "/internal/task-complete",
        **fenced(
            {
                **lease(c),
                "outcome": "succeeded",
                "final_events": [{"dataset_uuid": other_dag_dataset, "cursor": "2"}],
            }
        ),
    )
    assert done.status_code == 403
    assert snapshot(services) == before  # no event, no task, no state change


# -- the gateway: bodies counted as they stream, every error in Trace's shape ------------------
def _chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    for _ in range(total // size):
        yield b" " * size


def test_a_chunked_body_is_counted_as_it_streams(api: httpx.Client, services: Services) -> None:
    running_task(api)
    before = snapshot(services)
    for path in ("/internal/task-complete", "/v1/query", "/v1/dags"):
        # No Content-Length at all: 40 MB in chunks is refused once 2 MiB have streamed in.
        r = api.post(
            path, content=_chunks(40 * 1024 * 1024), headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 413, r.text
        assert r.json()["error"] == "too_large" and "limit" in r.json()["message"]
    assert api.get("/healthz").json()["ok"] is True  # the same connection, still usable
    assert snapshot(services) == before


def test_the_body_limit_reads_nothing_beyond_the_limit() -> None:
    """An endless body: the middleware stops pulling one message after the limit."""
    import asyncio

    from trace_platform.api.gateway import BodyLimit

    chunk, limit = 64 * 1024, 1_000_000
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"x" * chunk, "more_body": True}

    async def greedy_app(scope: Any, receive: Any, send: Any) -> None:
        while True:  # reads for ever, like a parser waiting for the end of the body
            await receive()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    asyncio.run(BodyLimit(greedy_app, max_bytes=limit)(scope, receive, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["error"] == "too_large"
    assert pulled == limit // chunk + 1  # the message that passed the limit, and no further


@pytest.mark.parametrize(
    ("path", "root_path"), [("/internal/claim", ""), ("/api/internal/claim", "/api")]
)
def test_the_internal_token_guards_the_path_the_router_matches(path: str, root_path: str) -> None:
    """InternalToken is the only check of the token: behind a proxy's root_path (the router
    matches `path` without it), /internal/* still needs the token."""
    import asyncio

    from trace_platform.api.gateway import InternalToken

    reached: list[str] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    guard = InternalToken(app, token="s3cret")  # type: ignore[arg-type]
    scope: dict[str, Any] = {"type": "http", "path": path, "root_path": root_path, "headers": []}
    for given in ([], [(b"x-internal-token", b"guess")]):
        asyncio.run(guard({**scope, "headers": given}, receive, send))  # type: ignore[arg-type]
        assert not reached and sent[0]["status"] == 401
        sent.clear()
    asyncio.run(guard({**scope, "headers": [(b"x-internal-token", b"s3cret")]}, receive, send))  # type: ignore[arg-type]
    assert reached == [path]


@pytest.mark.parametrize(
    ("method", "path", "status", "code", "needle"),
    [
        ("GET", "/v1/no-such-route", 404, "not_found", "no endpoint GET /v1/no-such-route"),
        ("DELETE", "/v1/tasks", 405, "method_not_allowed", "DELETE is not allowed"),
        ("GET", "/v1/dags/x;drop", 422, "invalid", "DAG name 'x;drop' must match"),
        ("GET", "/v1/dags/Hello", 422, "invalid", "DAG name 'Hello' must match"),
        ("GET", "/v1/datasets/a%00b", 422, "invalid", "dataset name"),
        ("PUT", "/v1/secrets/two%20words", 422, "invalid", "secret name 'two words'"),
        ("PUT", "/v1/secrets/trailing%0A", 422, "invalid", "secret name 'trailing\\n'"),
        ("POST", "/v1/hooks/dag/a'b", 422, "invalid", "trigger name"),
        ("GET", "/v1/runs?dag=a%00", 422, "invalid", "NUL"),
    ],
)
def test_routing_and_name_errors_are_in_traces_shape(
    api: httpx.Client, method: str, path: str, status: int, code: str, needle: str
) -> None:
    r = api.request(method, path, json={"value": "v"} if method == "PUT" else None)
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "message", "detail"}
    assert body["error"] == code and needle in body["message"], body


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"config": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deeper than the limit of 64"),
        (b'{"config": {"a": ' + b"[" * 64 + b"]" * 64 + b"}}", "deeper than the limit of 64"),
        (b'{"config": {"a": NaN}}', "invalid JSON"),
        (b'{"config": {"a": 1e999}}', "out of range"),
        (b'{"config": {"a": ' + b"9" * 5000 + b"}}", "invalid JSON"),
        (b'{"config": {"a": "\\u0000"}}', "NUL"),
        (b'{"config": {"a": "\\ud800"}}', "lone surrogate"),
        (b'{"config": {"\xff": 1}}', "invalid JSON"),
    ],
)
def test_hostile_json_is_422_in_traces_shape(
    api: httpx.Client, services: Services, content: bytes, needle: str
) -> None:
    before = snapshot(services)
    r = api.post("/v1/tasks", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request" and needle in r.json()["message"]
    assert snapshot(services) == before


def test_json_at_the_depth_limit_is_accepted(api: httpx.Client) -> None:
    config = {"a": json.loads("[" * 62 + "]" * 62)}  # 64 levels with the body and config
    r = api.post("/v1/tasks", json={"job": "j", "operator": "noop", "config": config})
    assert r.status_code == 201, r.text


def test_an_unexpected_error_is_a_500_in_traces_shape_without_internals(
    api: httpx.Client, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any) -> Any:
        raise RuntimeError("secret internals: /srv/trace/db password=hunter2")

    monkeypatch.setattr(services.control, "list_dags", broken)
    r = api.get("/v1/dags")
    assert r.status_code == 500
    body = r.json()
    assert body["error"] == "internal" and body["detail"]["error_id"] in body["message"]
    assert "hunter2" not in r.text and "RuntimeError" not in r.text
    assert api.get("/healthz").status_code == 200  # the connection was kept


def test_a_dag_file_problem_is_422_with_every_problem(api: httpx.Client) -> None:
    r = api.post("/v1/dags", json={"yaml": "name: Bad-Name\njobs: {}\n"})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "invalid_dag" and len(body["detail"]["problems"]) >= 2
    assert "name" in body["message"] and "jobs" in body["message"]
