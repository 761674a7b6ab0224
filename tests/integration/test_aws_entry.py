"""The AWS entry adapters (aws/eventbridge.py, aws/apigateway.py) against a real Postgres, fed
the event shapes AWS documents (tests/data/aws_events, ids adapted): each valid one fires once
(a duplicate delivery fires nothing new), each malformed one is refused naming its problem with
no run, task, outbox row or cron cursor stored. The webhook's refusals are the Lite Gateway's:
each is sent to both and the answers compared."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.dags import admin
from tests.support.servers import admin_key
from trace_platform.api.app import create_hooks_app
from trace_platform.api.gateway import MAX_BODY_BYTES
from trace_platform.aws import apigateway, container, eventbridge
from trace_platform.config import Settings, get_settings
from trace_platform.control.service import MAX_TRIGGER_CONFIG_BYTES
from trace_platform.db.embedded import free_port
from trace_platform.errors import Conflict, Invalid, NotFound, TraceError
from trace_platform.services import Services
from trace_platform.triggers import cron

EVENTS = Path(__file__).resolve().parent.parent / "data" / "aws_events"

NIGHTLY = """
name: nightly
jobs:
  load: {operator: noop}
triggers:
  cron: [{name: daily, schedule: "0 2 * * *", config: {window: day}}]
  webhooks: [{name: poke, config: {from_hook: true}}]
"""
TICK = "2024-05-01T02:00:00Z"  # the recorded events' scheduled time
BEFORE = "2024-04-30T02:00:00Z"  # the tick before: the cron cursor as if fired then


def recorded(name: str) -> Any:
    return json.loads((EVENTS / name).read_text())


def _q(svc: Services, sql: str, *args: Any) -> list[dict[str, Any]]:
    with svc.pool.connection() as conn:
        cur = conn.execute(sql, list(args))
        return cur.fetchall() if cur.description else []


def stored(svc: Services) -> dict[str, Any]:
    """What a fire stores: runs, their tasks, outbox rows, and the cron cursors."""
    counts = _q(
        svc,
        "SELECT (SELECT count(*) FROM trigger_fires) AS runs,"
        " (SELECT count(*) FROM task_registry) AS tasks,"
        " (SELECT count(*) FROM outbox) AS outbox",
    )[0]
    cursors = _q(svc, "SELECT trigger, last_fire_at FROM cron_state ORDER BY trigger")
    return {**counts, "cursors": [(c["trigger"], c["last_fire_at"]) for c in cursors]}


def one_run_more(svc: Services, before: dict[str, Any]) -> dict[str, Any]:
    """What is stored now, checked to hold one run, one task and one outbox row more than
    `before` (a fire of a one-source DAG)."""
    after = stored(svc)
    assert (after["runs"], after["tasks"], after["outbox"]) == (
        before["runs"] + 1,
        before["tasks"] + 1,
        before["outbox"] + 1,
    )
    return after


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The suite's settings with API keys required, as in the aws profile."""
    return settings.model_copy(update={"auth": "required"})


@pytest.fixture
def svc(services: Services) -> Iterator[Services]:
    """The services both handlers serve with (as a Lambda container's would), `nightly`
    deployed and its cron cursor before the recorded tick."""
    services.control.deploy(admin(services), NIGHTLY)
    _q(services, "UPDATE cron_state SET last_fire_at = %s", BEFORE)
    container.install(services)
    yield services
    container.install(None)


def fire_row(svc: Services, run_id: str) -> dict[str, Any]:
    return _q(svc, "SELECT kind, fire_key, config FROM trigger_fires WHERE run_id = %s", run_id)[0]


# -- EventBridge ------------------------------------------------------------------------------


def scheduler_input(scheduled_time: str = TICK, **extra: Any) -> dict[str, Any]:
    """The documented schedule target's Input, as Scheduler delivers it: its context attributes
    filled in."""
    text = recorded("scheduler_target.json")["Input"]
    text = text.replace("<aws.scheduler.scheduled-time>", scheduled_time)
    text = text.replace(
        "<aws.scheduler.schedule-arn>", "arn:aws:scheduler:us-east-1:123456789012:schedule/x/y"
    )
    return {**json.loads(text), **extra}


def transformed(event: dict[str, Any]) -> Any:
    """A rule's event through the documented target's input transformer (its placeholders sit
    in quotes: EventBridge puts the raw value there)."""
    transformer = recorded("rule_target.json")["InputTransformer"]
    text = transformer["InputTemplate"]
    for name, path in transformer["InputPathsMap"].items():
        assert path.startswith("$.")
        text = text.replace(f"<{name}>", str(event[path[2:]]))
    text = text.replace("<aws.events.rule-arn>", event["resources"][0])
    return json.loads(text)


def test_a_scheduler_tick_fires_once(svc: Services) -> None:
    before = stored(svc)
    first = eventbridge.handler(scheduler_input(), None)
    assert first["created"] is True and len(first["tasks"]) == 1
    after = one_run_more(svc, before)
    fire = fire_row(svc, first["run_id"])
    assert fire == {
        "kind": "cron",
        "fire_key": "2024-05-01T02:00:00+00:00",  # the Lite scheduler's key for this tick
        "config": {"window": "day", "source": "scheduler", "scheduled_for": fire["fire_key"]},
    }
    assert after["cursors"] == [("daily", datetime(2024, 5, 1, 2, tzinfo=UTC))]

    # Delivered again (at least once), and with the seconds a rate schedule's time carries:
    # the same tick, no new run.
    for again in (scheduler_input(), scheduler_input("2024-05-01T02:00:43Z")):
        dup = eventbridge.handler(again, None)
        assert dup == {"run_id": first["run_id"], "created": False, "tasks": []}
    assert stored(svc) == after
    # The Lite scheduler, were it running too, has nothing left to fire for that tick.
    assert cron.tick(svc.dispatcher, now=datetime(2024, 5, 1, 2, 0, 30, tzinfo=UTC)) == 0
    assert stored(svc) == after


def test_a_tick_the_lite_scheduler_fired_fires_nothing_more(svc: Services) -> None:
    assert cron.tick(svc.dispatcher, now=datetime(2024, 5, 1, 2, 0, 30, tzinfo=UTC)) == 1
    after = stored(svc)
    out = eventbridge.handler(scheduler_input(), None)
    assert out["created"] is False and out["tasks"] == [] and out["run_id"] is not None
    assert stored(svc) == after


def test_a_rule_event_through_its_input_transformer_fires_once(svc: Services) -> None:
    event = transformed(recorded("rule_scheduled_event.json"))
    assert event["scheduled_time"] == TICK and event["schedule"].endswith(
        "rule/trace-nightly-daily"
    )
    first = eventbridge.handler(event, None)
    assert first["created"] is True and len(first["tasks"]) == 1
    after = stored(svc)
    assert eventbridge.handler(event, None) == {
        "run_id": first["run_id"],
        "created": False,
        "tasks": [],
    }
    assert stored(svc) == after


def test_missed_late_and_paused_ticks_as_the_scheduler_treats_them(svc: Services) -> None:
    # 1 and 2 May were never delivered: 3 May fires, counting them as skipped (catch-up).
    out = eventbridge.handler(scheduler_input("2024-05-03T02:00:00Z"), None)
    assert fire_row(svc, out["run_id"])["config"]["skipped_ticks"] == 2
    after = stored(svc)
    # 2 May's delivery comes late: past the cursor, skipped like the scheduler skips it.
    late = eventbridge.handler(scheduler_input("2024-05-02T02:00:00Z"), None)
    assert late["created"] is False and late["run_id"] is None
    assert "last fired for 2024-05-03T02:00:00+00:00" in late["skipped"]
    # A paused DAG's tick fires nothing and leaves the cursor for the catch-up on resume.
    svc.control.changes.set_paused(admin(svc), "nightly", True)
    paused = eventbridge.handler(scheduler_input("2024-05-04T02:00:00Z"), None)
    assert paused["created"] is False and paused["skipped"] == "the DAG is paused"
    assert stored(svc) == after


@pytest.mark.parametrize("by", ["eventbridge", "lite"])
def test_a_tick_after_a_long_silence_fires_for_itself(svc: Services, by: str) -> None:
    """More ticks missed than the catch-up counts one by one (10,000: the trigger's cursor 54
    years back, a daily schedule): the run is still the delivered (or latest due) tick's, its
    key and the cursor that tick, never some tick in between (27 years back: the next
    delivery would fire again)."""
    _q(svc, "UPDATE cron_state SET last_fire_at = %s", "1970-01-01T02:00:00Z")
    if by == "eventbridge":
        run_id = eventbridge.handler(scheduler_input(), None)["run_id"]
    else:
        assert cron.tick(svc.dispatcher, now=datetime(2024, 5, 1, 2, 0, 30, tzinfo=UTC)) == 1
        run_id = _q(svc, "SELECT run_id FROM trigger_fires")[0]["run_id"]
    fire = fire_row(svc, run_id)
    assert fire["fire_key"] == "2024-05-01T02:00:00+00:00"
    assert fire["config"]["scheduled_for"] == fire["fire_key"]
    assert fire["config"]["skipped_ticks"] == cron.MAX_COUNTED_TICKS - 1  # at least that many
    assert stored(svc)["cursors"] == [("daily", datetime(2024, 5, 1, 2, tzinfo=UTC))]


def _rule_event(_: Any) -> Any:
    return recorded("rule_scheduled_event.json")


BAD_SCHEDULES: list[tuple[str, Callable[[dict[str, Any]], Any], type[TraceError], str]] = [
    ("rule event untransformed", _rule_event, Invalid, "names no DAG: give the rule's target"),
    (
        "another service's event",
        lambda _: recorded("ec2_state_change_event.json"),
        Invalid,
        "'EC2 Instance State-change Notification'",
    ),
    ("not an object", lambda e: [e], Invalid, "is a JSON list, not the schedule input"),
    (
        "no time",
        lambda e: {k: v for k, v in e.items() if k != "scheduled_time"},
        Invalid,
        "scheduled_time: Field required",
    ),
    (
        "placeholder a rule leaves",
        lambda e: {**e, "scheduled_time": "<aws.scheduler.scheduled-time>"},
        Invalid,
        "only EventBridge Scheduler fills in its context attributes",
    ),
    ("not a time", lambda e: {**e, "scheduled_time": "yesterday"}, Invalid, "not an ISO 8601"),
    ("no zone", lambda e: {**e, "scheduled_time": "2024-05-01T02:00:00"}, Invalid, "no time zone"),
    (
        "off the schedule",
        lambda e: {**e, "scheduled_time": "2024-05-01T02:30:00Z"},
        Invalid,
        "is not a tick of trigger 'daily' of DAG 'nightly' (schedule '0 2 * * *'",
    ),
    (
        "in the future",
        lambda e: {**e, "scheduled_time": "2999-01-01T02:00:00Z"},
        Invalid,
        "is in the future",
    ),
    (
        "unknown org",
        lambda e: {**e, "org": "acme"},
        NotFound,
        "no DAG named 'nightly' in org 'acme'",
    ),
    ("unknown DAG", lambda e: {**e, "dag": "daily"}, NotFound, "no DAG named 'daily'"),
    ("unknown trigger", lambda e: {**e, "trigger": "hourly"}, NotFound, "no cron trigger 'hourly'"),
    ("a webhook's name", lambda e: {**e, "trigger": "poke"}, NotFound, "no cron trigger 'poke'"),
    ("bad DAG name", lambda e: {**e, "dag": "Nightly!"}, Invalid, "dag: String should match"),
    ("a number for a name", lambda e: {**e, "trigger": 5}, Invalid, "trigger: Input should be"),
    ("a typo'd key", lambda e: {**e, "dag_name": "x"}, Invalid, "dag_name: Extra inputs"),
    ("config not an object", lambda e: {**e, "config": "x"}, Invalid, "config: Input should be"),
    (
        "config over the limit",
        lambda e: {**e, "config": {"x": "y" * MAX_TRIGGER_CONFIG_BYTES}},
        Invalid,
        f"the limit is {MAX_TRIGGER_CONFIG_BYTES}",
    ),
]


def test_malformed_schedule_events_are_refused_storing_nothing(svc: Services) -> None:
    before = stored(svc)
    for name, mutate, error, message in BAD_SCHEDULES:
        with pytest.raises(error) as refused:
            eventbridge.handler(mutate(scheduler_input()), None)
        assert message in refused.value.message, (name, refused.value.message)
        assert stored(svc) == before, name


def test_an_undeployed_dag_is_refused(svc: Services) -> None:
    _q(svc, "UPDATE dags SET active_version = NULL WHERE name = 'nightly'")
    before = stored(svc)
    with pytest.raises(Conflict, match="has no active version"):
        eventbridge.handler(scheduler_input(), None)
    assert stored(svc) == before


def test_a_container_builds_its_services_once_from_the_aws_environment(
    svc: Services, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a Lambda has: TRACE_PROFILE=aws and its settings in the environment, no Services
    until the first invocation, then the same ones for every later one. Firing needs no queue
    (the intent and outbox rows are the Dispatcher's to publish)."""
    env = {
        "TRACE_PROFILE": "aws",
        "TRACE_STATE_DSN": dsn,
        "TRACE_INTERNAL_TOKEN": "t" * 32,
        "TRACE_HOME": str(tmp_path / "lambda"),
        "TRACE_POOL_MAX_SIZE": "2",
        "TRACE_OPERATOR_REGISTRY": "production",  # the test run's default is refused in aws
        "TRACE_SQS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",  # never called
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    container.install(None)
    built = container.services()
    try:
        assert built is not svc and built.settings.profile.value == "aws"
        out = eventbridge.handler(scheduler_input(), None)
        assert eventbridge.handler(scheduler_input(), None)["run_id"] == out["run_id"]
        assert container.services() is built
    finally:
        container.install(None)
        get_settings.cache_clear()
        built.close()
    assert out["created"] is True and fire_row(svc, out["run_id"])["kind"] == "cron"


# -- API Gateway ------------------------------------------------------------------------------


def hook_event(name: str, key: str) -> dict[str, Any]:
    """A recorded API Gateway event, sent with `key`."""
    text = (EVENTS / name).read_text().replace("<api-key>", key)
    return json.loads(text)


def answer(response: dict[str, Any]) -> tuple[int, Any]:
    assert set(response) == {"statusCode", "headers", "body", "isBase64Encoded"}
    assert response["isBase64Encoded"] is False
    assert response["headers"]["content-type"] == "application/json"
    return response["statusCode"], json.loads(response["body"])


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("apigw_rest_v1.json", {"from_hook": True, "x": 1}),
        ("apigw_http_v2.json", {"from_hook": True, "x": 2}),  # its body base64-encoded
        ("apigw_http_v1.json", {"from_hook": True, "x": 3}),  # a $default route: by its path
    ],
)
def test_a_webhook_event_fires_once(svc: Services, name: str, config: dict[str, Any]) -> None:
    event = hook_event(name, admin_key(svc))
    before = stored(svc)
    status, first = answer(apigateway.handler(event, None))
    assert status == 201 and first["created"] is True and len(first["tasks"]) == 1
    after = one_run_more(svc, before)
    fire = fire_row(svc, first["run_id"])
    key = next(v for k, v in event["headers"].items() if k.lower() == "idempotency-key")
    assert fire == {"kind": "webhook", "fire_key": key, "config": config}
    # The same delivery again (its Idempotency-Key): the same run, nothing new.
    status, dup = answer(apigateway.handler(event, None))
    assert (status, dup) == (201, {"run_id": first["run_id"], "created": False, "tasks": []})
    assert stored(svc) == after


def _v1(key: str) -> dict[str, Any]:
    return hook_event("apigw_rest_v1.json", key)


def _headers(event: dict[str, Any], **given: str | None) -> dict[str, Any]:
    """`event` with headers set (None: removed), in both of format 1.0's header maps."""
    out = copy.deepcopy(event)
    for name, value in given.items():
        header = name.replace("_", "-")
        for field in ("headers", "multiValueHeaders"):
            held = out[field]
            for k in [k for k in held if k.lower() == header.lower()]:
                del held[k]
            if value is not None:
                held[header] = value if field == "headers" else [value]
    return out


# Refusals the Lite Gateway makes too: (id, the event changed, status, error code, message).
AS_THE_GATEWAY: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], int, str, str]] = [
    ("body not JSON", lambda e: {**e, "body": "{x: 1"}, 422, "invalid_request", "invalid JSON"),
    ("body a list", lambda e: {**e, "body": "[1]"}, 422, "invalid_request", "valid dictionary"),
    ("body with a NUL", lambda e: {**e, "body": '{"x": "\\u0000"}'}, 422, "invalid_request", "NUL"),
    (
        "body oversized",
        lambda e: {**e, "body": json.dumps({"x": "y" * MAX_BODY_BYTES})},
        413,
        "too_large",
        f"the limit is {MAX_BODY_BYTES}",
    ),
    (
        "no auth",
        lambda e: _headers(e, Authorization=None),
        401,
        "unauthorized",
        "API key is required",
    ),
    (
        "unknown key",
        lambda e: _headers(e, Authorization="Bearer trc_nope"),
        401,
        "unauthorized",
        "unknown or revoked API key",
    ),
    ("wrong method", lambda e: {**e, "httpMethod": "GET"}, 405, "method_not_allowed", "GET is not"),
    (
        "idempotency key too long",
        lambda e: _headers(e, Idempotency_Key="k" * 201),
        422,
        "invalid_request",
        "at most 200 characters",
    ),
    (
        "unknown trigger",
        lambda e: {**e, "pathParameters": {"dag": "nightly", "trigger": "nope"}},
        404,
        "not_found",
        "has no webhook trigger 'nope'",
    ),
    (
        "a cron trigger's name",
        lambda e: {**e, "pathParameters": {"dag": "nightly", "trigger": "daily"}},
        404,
        "not_found",
        "has no webhook trigger 'daily'",
    ),
    (
        "bad DAG name",
        lambda e: {**e, "pathParameters": {"dag": "Night-ly", "trigger": "poke"}},
        422,
        "invalid",
        "DAG name 'Night-ly' must match",
    ),
]


def as_http(api: httpx.Client, event: dict[str, Any]) -> httpx.Response:
    """The HTTP request a format 1.0 event stands for, sent to the Lite Gateway."""
    params = event["pathParameters"]
    headers = {
        k: v[-1]
        for k, v in event["multiValueHeaders"].items()
        if k.lower() not in ("host", "content-length")
    }
    return api.request(
        event["httpMethod"],
        f"/v1/hooks/{params['dag']}/{params['trigger']}",
        headers=headers,
        content=event["body"].encode(),
        timeout=30,
    )


def test_refused_webhook_events_answer_as_the_gateway_storing_nothing(
    svc: Services, api: httpx.Client
) -> None:
    """`api`: the Lite Gateway over the same services."""
    before = stored(svc)
    for name, mutate, status, code, message in AS_THE_GATEWAY:
        event = mutate(_v1(admin_key(svc)))
        got_status, got = answer(apigateway.handler(event, None))
        assert (got_status, got["error"]) == (status, code), (name, got)
        assert message in got["message"], (name, got)
        assert stored(svc) == before, name
        lite = as_http(api, event)
        assert (lite.status_code, lite.json()) == (got_status, got), name
        assert stored(svc) == before, name


def _v2(key: str) -> dict[str, Any]:
    return hook_event("apigw_http_v2.json", key)


# Events no HTTP request could make: the adapter's own refusals, in the Gateway's error shape.
NOT_A_REQUEST: list[tuple[str, Callable[[str], Any], int, str, str]] = [
    ("a list", lambda k: [_v1(k)], 400, "bad_request", "not an API Gateway proxy event"),
    ("not API Gateway's", lambda k: {"body": "{}"}, 400, "bad_request", "neither payload format"),
    (
        "an EventBridge event",
        lambda k: recorded("rule_scheduled_event.json"),
        400,
        "bad_request",
        "neither payload format",
    ),
    (
        "2.0 without a method",
        lambda k: {**_v2(k), "requestContext": {"http": {"path": "/"}}},
        400,
        "bad_request",
        "no HTTP method (requestContext.http.method)",
    ),
    (
        "base64 garbage",
        lambda k: {**_v2(k), "body": "eyJ4Ijog%%%"},
        400,
        "bad_request",
        "marked isBase64Encoded but is not base64",
    ),
    ("body not text", lambda k: {**_v1(k), "body": {"x": 1}}, 400, "bad_request", "body is not"),
    (
        "headers not an object",
        lambda k: {**_v2(k), "headers": ["authorization"]},
        400,
        "bad_request",
        "headers are not an object",
    ),
    (
        "a header not text",
        lambda k: {**_v2(k), "headers": {**_v2(k)["headers"], "idempotency-key": 5}},
        400,
        "bad_request",
        "header 'idempotency-key' is not text",
    ),
    (
        "no route",
        lambda k: {**_v2(k), "routeKey": "$default", "rawPath": "/", "pathParameters": None},
        404,
        "not_found",
        "serves only /v1/hooks/{dag}/{trigger}",
    ),
    (
        "another route",
        lambda k: {**_v1(k), "pathParameters": {"proxy": "v1/dags"}, "path": "/v1/dags"},
        404,
        "not_found",
        "its path ('/v1/dags') is not a hook's",
    ),
]


def test_events_no_request_could_make_are_refused_storing_nothing(svc: Services) -> None:
    before = stored(svc)
    for name, make, status, code, message in NOT_A_REQUEST:
        got_status, got = answer(apigateway.handler(make(admin_key(svc)), None))
        assert (got_status, got["error"], got["detail"]) == (status, code, {}), (name, got)
        assert message in got["message"], (name, got)
        assert stored(svc) == before, name


def test_the_webhook_function_serves_no_other_route(svc: Services) -> None:
    """A catch-all route's other paths (the API's, /internal, the OpenAPI pages) are refused
    before the app; and the app itself, asked for them, has none of them."""
    key = admin_key(svc)
    app = create_hooks_app(svc)
    for path in ("/v1/dags", "/internal/task-fetch", "/docs", "/openapi.json"):
        event = {**_v2(key), "rawPath": path, "pathParameters": {}}
        event["requestContext"] = {**event["requestContext"], "http": {"method": "GET"}}
        status, got = answer(apigateway.handler(event, None))
        assert status == 404 and got["error"] == "not_found", path
        scope, _ = apigateway.request(_v2(key))
        scope = {**scope, "method": "GET", "path": path, "raw_path": path.encode()}
        status, _, body = asyncio.run(apigateway.serve(app, scope, b""))
        assert status == 404 and json.loads(body)["message"] == f"no endpoint GET {path}"


def test_a_base64_body_and_the_text_body_fire_alike(svc: Services) -> None:
    """Format 2.0 sends a body as base64 or as text; both are the same request."""
    event = _v2(admin_key(svc))
    plain = {
        **event,
        "body": base64.b64decode(event["body"]).decode(),
        "isBase64Encoded": False,
        "headers": {**event["headers"], "idempotency-key": str(uuid.uuid4())},
    }
    for one in (event, plain):
        status, out = answer(apigateway.handler(one, None))
        assert status == 201 and out["created"] is True
        assert fire_row(svc, out["run_id"])["config"] == {"from_hook": True, "x": 2}
