"""schemathesis against every endpoint of the API's own OpenAPI schema, over a real socket with a
real Services: no 5xx for any generated request (valid by the schema or not), and every 4xx in
Trace's error shape `{"error", "message", "detail"}`. Each generated case is sent twice, as the
org admin and as a user without roles (both with the internal token, so the internal endpoints
are fuzzed past their guard). Bounded: MAX_EXAMPLES cases per endpoint and generation mode,
derandomized, no shrinking, so a run is repeatable and takes about a minute."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi._hypothesis import _draw_negated_locations

from tests.support.dags import admin, three_jobs, user
from trace_platform.api.app import create_app
from trace_platform.config import Settings
from trace_platform.db.embedded import free_port
from trace_platform.lite.stack import ApiServer
from trace_platform.services import Services

MAX_EXAMPLES = int(os.environ.get("TRACE_FUZZ_EXAMPLES", "25"))
FAILURES_PER_OPERATION = 3


@dataclass
class Target:
    url: str
    schema: Any
    internal_token: str
    keys: dict[str, str]  # who -> API key
    statuses: Counter[int] = field(default_factory=Counter)


@pytest.fixture
def target(settings: Settings, dsn: str) -> Iterator[Target]:
    svc = Services.build(settings.model_copy(update={"auth": "required"}), dsn)
    server = ApiServer(svc, "127.0.0.1", free_port(), background=False)
    server.start()
    try:
        svc.control.deploy(admin(svc), three_jobs("hello"))  # something to find, trigger, read
        admin_key = svc.new_admin_key or (svc.settings.home / "admin.key").read_text().strip()
        _, user_key = user(svc, "mallory")
        schema = schemathesis.openapi.from_dict(create_app(svc, background=False).openapi())
        yield Target(
            url=server.url,
            schema=schema,
            internal_token=svc.internal_token or "",
            keys={"admin": admin_key, "no-role user": user_key},
        )
    finally:
        server.stop()
        svc.close()


def shape_problem(status: int, content: bytes) -> str | None:
    """Why a response breaks the contract, or None."""
    if status >= 500:
        return f"HTTP {status}: {content[:300]!r}"
    if status < 400:
        return None
    try:
        body = json.loads(content)
    except ValueError:
        return f"HTTP {status} is not JSON: {content[:300]!r}"
    if not (
        isinstance(body, dict)
        and set(body) == {"error", "message", "detail"}
        and isinstance(body["error"], str)
        and body["error"]
        and isinstance(body["message"], str)
        and body["message"]
        and isinstance(body["detail"], dict)
    ):
        return f"HTTP {status} is not in Trace's error shape: {content[:300]!r}"
    return None


def negatable(operation: Any) -> bool:
    """Whether schemathesis can break anything of a request to `operation` (its own choice of
    the locations a negative case may break: a body, or parameters with a constraint to
    violate). With nothing, every negative case it draws is rejected and hypothesis gives up
    (Unsatisfiable) after some 460 draws having sent nothing: the negative runs of 17 of the 52
    routes, a quarter of this test's time, for no request. Checked to pick exactly those 17
    (schemathesis 4.32.5)."""
    no_explicit: dict[ParameterLocation, None] = {
        loc: None
        for loc in (
            ParameterLocation.PATH,
            ParameterLocation.HEADER,
            ParameterLocation.COOKIE,
            ParameterLocation.QUERY,
        )
    }
    locations = _draw_negated_locations(
        lambda _strategy: True,  # its draw, only made once there is a location to choose
        operation,
        GenerationMode.NEGATIVE,
        explicit=no_explicit,
        body_is_generated=True,
    )
    return locations is not None


def fuzz(operation: Any, mode: GenerationMode, target: Target) -> list[str]:
    found: list[str] = []
    if mode is GenerationMode.NEGATIVE and not negatable(operation):
        return found
    session = requests.Session()
    session.trust_env = False  # 127.0.0.1: no proxy, no ~/.netrc to look up on every request

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        for who, key in target.keys.items():
            headers = {"Authorization": f"Bearer {key}", "X-Internal-Token": target.internal_token}
            try:
                response = case.call(
                    base_url=target.url, session=session, headers=headers, timeout=60
                )
            except requests.RequestException as e:
                problem: str | None = f"no response: {e!r}"
            else:
                target.statuses[response.status_code] += 1
                problem = shape_problem(response.status_code, response.content)
            if problem and len(found) < FAILURES_PER_OPERATION:
                curl = case.as_curl_command(headers=headers)
                found.append(f"{operation.label} ({mode.value}, {who}): {problem}\n    {curl}")

    try:
        run()
    except Unsatisfiable:  # nothing to make invalid (no parameters, no body): nothing to send
        assert mode is GenerationMode.NEGATIVE
    finally:
        session.close()
    return found


def test_every_endpoint_answers_without_5xx_and_in_traces_error_shape(target: Target) -> None:
    labels: list[str] = []
    failures: list[str] = []
    negative: list[str] = []
    for result in target.schema.get_all_operations():
        operation = result.ok()
        labels.append(operation.label)
        if negatable(operation):
            negative.append(operation.label)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            failures += fuzz(operation, mode, target)
    assert len(labels) >= 24, labels  # every route (docs/reference/http-api.md)
    # Bodies and constrained parameters are fuzzed invalid too; only a route with neither (a
    # list, or a plain {name} action) is left to the valid cases.
    assert "POST /v1/dags" in negative and "GET /v1/dags" not in negative, negative
    assert len(negative) >= len(labels) // 2, (negative, labels)
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures)
    # The fuzz got past authentication and validation, not only bounced off them.
    assert any(200 <= s < 300 for s in target.statuses), target.statuses
    assert target.statuses[422] and target.statuses[404], target.statuses
