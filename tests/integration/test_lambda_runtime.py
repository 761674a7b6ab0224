"""The lambda runtime (issue 41): a lambda task is claimed by the Lambda invoker, never by a
platform worker, through the same lease as a container job's; the handler runs the operator
(here in Lite's local invoker: a sandboxed subprocess; against moto's Lambda through boto3's
Invoke); and whatever the invocation ends in (a timeout, a crash, garbage) fails the attempt,
which the Dispatcher retries by the task's own policy. A late answer of an earlier attempt
lands nothing. Real parts throughout: Postgres, the API over a socket, pgqueue, the subprocess,
moto's HTTP server."""

from __future__ import annotations

import io
import json
import threading
import uuid
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import httpx
import pytest

from tests.support.dags import admin
from tests.support.invariants import expire_lease
from tests.support.wait import wait_for
from trace_platform.aws.invokers import AwsInvoker, Invoker, LocalInvoker, Reply, answered
from trace_platform.aws.lambda_runner import LambdaRunner, judge
from trace_platform.config import Settings
from trace_platform.contract import Claim, ClaimRequest, DatasetRef, TaskPayload, TaskSpec
from trace_platform.db.embedded import free_port
from trace_platform.lite.bootstrap import internal_token
from trace_platform.lite.stack import ApiServer, LiteStack
from trace_platform.objectstore import make_store
from trace_platform.queue.driver import Message
from trace_platform.queue.pgqueue import PgQueue
from trace_platform.sandbox import resolve
from trace_platform.services import Services
from trace_platform.worker.client import DispatcherClient

TIMEOUT = 4.0  # the function's timeout here: a sandboxed child starts well within it
FUNCTION = "trace-operator"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # Leases long enough for an invocation's child to start on a loaded machine (heartbeats
    # keep them anyway); retries at once.
    return settings.model_copy(
        update={"lease_seconds": 6.0, "heartbeat_seconds": 1.0, "operator_registry": "testing"}
    )


@pytest.fixture
def api(services: Services) -> Iterator[str]:
    """The API with the Dispatcher's loops (outbox publisher, reaper) over a real socket."""
    server = ApiServer(services, "127.0.0.1", free_port(), background=True)
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def client(services: Services, api: str) -> Iterator[DispatcherClient]:
    c = DispatcherClient(api, internal_token=internal_token(services.settings), retries=2)
    yield c
    c.close()


@pytest.fixture
def driver(dsn: str) -> Iterator[PgQueue]:
    d = PgQueue.from_dsn(dsn, poll_seconds=0.2)
    yield d
    d.close()


@pytest.fixture
def local(settings: Settings) -> LocalInvoker:
    store = make_store(settings)
    store.ensure_bucket()
    return LocalInvoker(
        store,
        settings.home,
        resolve(settings),  # sandboxed as an operator host is, where this test may
        TIMEOUT,
        extra_env={"TRACE_OPERATOR_REGISTRY": "testing"},
    )


class ByHand:
    """A Lambda invoker the test drives step by step (no loop takes its queue's messages)."""

    def __init__(
        self, settings: Settings, local: LocalInvoker, driver: PgQueue, client: DispatcherClient
    ) -> None:
        self.driver, self.client, self.queue = driver, client, settings.lambda_queue
        self.runner = LambdaRunner(driver, client, local, queue_name=self.queue)

    def wakeup(self, what: str = "the wake-up on the lambda queue") -> Message:
        (msg,) = wait_for(lambda: self.driver.receive(self.queue, 1, 30), 30, what)
        return msg

    def claim(self, task_id: uuid.UUID) -> Claim:
        return self.client.claim(task_id, self.runner.worker_id)


@pytest.fixture
def by_hand(
    settings: Settings, local: LocalInvoker, driver: PgQueue, client: DispatcherClient
) -> ByHand:
    return ByHand(settings, local, driver, client)


@pytest.fixture
def run_with(
    settings: Settings, driver: PgQueue, client: DispatcherClient
) -> Iterator[Callable[[Invoker], LambdaRunner]]:
    """Starts a Lambda invoker's loop over `invoker`, stopped (and waited for) at the end."""
    running: list[tuple[threading.Event, threading.Thread]] = []

    def start(invoker: Invoker) -> LambdaRunner:
        runner = LambdaRunner(
            driver,
            client,
            invoker,
            queue_name=settings.lambda_queue,
            concurrency=2,
            visibility_seconds=30,
            wait_seconds=0.2,
        )
        stop = threading.Event()
        thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
        thread.start()
        running.append((stop, thread))
        return runner

    yield start
    for stop, thread in running:
        stop.set()
        thread.join(60)
        assert not thread.is_alive(), "the invoker's loop did not end"


def lambda_task(
    services: Services, operator: str, max_attempts: int = 2, **config: Any
) -> uuid.UUID:
    spec = TaskSpec(
        job="fn",
        operator=operator,
        runtime="lambda",
        config=config,
        outputs=[DatasetRef(dataset_uuid=uuid.uuid4())],
        max_attempts=max_attempts,
        retry_backoff_seconds=0,
    )
    return services.dispatcher.create_task(spec).task_id


def ended(services: Services, task_id: uuid.UUID, timeout: float = 60) -> Any:
    return wait_for(
        lambda: (
            (v := services.dispatcher.get_task(task_id)).status in ("succeeded", "failed") and v
        ),
        timeout,
        f"task {task_id} ended",
    )


def attempt_errors(services: Services, task_id: uuid.UUID) -> list[tuple[str, str]]:
    with services.pool.connection() as conn:
        rows = conn.execute(
            "SELECT outcome, error, worker_id FROM task_attempts WHERE task_id = %s"
            " ORDER BY attempt",
            (task_id,),
        ).fetchall()
    assert all(r["worker_id"].startswith("lambda.") for r in rows), rows  # the invoker's
    return [(r["outcome"], r["error"] or "") for r in rows]


# -- through the local invoker ------------------------------------------------------------
def test_a_lambda_task_runs_through_the_local_invoker_and_its_events_land(
    services: Services, local: LocalInvoker, run_with: Callable[[Invoker], LambdaRunner]
) -> None:
    """Mid-run events and final ones, as the handler returned them, forwarded attempt-fenced."""
    run_with(local)
    task_id = lambda_task(services, "emit_events", count=3, final=1)
    view = ended(services, task_id)
    assert (view.status, view.attempt, view.events) == ("succeeded", 1, 3)
    assert attempt_errors(services, task_id) == [("succeeded", "")]


@pytest.mark.parametrize(
    ("operator", "config", "why"),
    [
        ("sleep", {"seconds": 60}, f"Task timed out after {TIMEOUT:.2f} seconds"),
        # SIGKILLed: "signal 9", or in the sandbox its PID 1's "exit code 137"
        ("crash", {}, "the handler's process died ("),
        ("fail", {"message": "no luck"}, "OperatorError: no luck"),
    ],
    ids=["times-out", "crashes", "fails"],
)
def test_an_invocation_that_ends_badly_is_retried_by_the_dispatcher(
    services: Services,
    local: LocalInvoker,
    run_with: Callable[[Invoker], LambdaRunner],
    operator: str,
    config: dict[str, Any],
    why: str,
) -> None:
    run_with(local)
    task_id = lambda_task(services, operator, max_attempts=2, **config)
    view = ended(services, task_id, 90)
    assert (view.status, view.attempt) == ("failed", 2)  # its policy: two tries
    errors = attempt_errors(services, task_id)
    assert [o for o, _ in errors] == ["failed", "failed"]
    assert all(why in e for _, e in errors), errors


def test_a_late_answer_of_an_earlier_attempt_lands_nothing(
    services: Services, by_hand: ByHand
) -> None:
    """Attempt 1's invocation answers (a success with events) only after its lease ran out and
    attempt 2 was claimed: its report is refused, nothing of it lands; attempt 2's does."""
    runner = by_hand.runner
    task_id = lambda_task(services, "emit_events", max_attempts=3, count=2, final=1)
    msg = by_hand.wakeup()
    first = by_hand.claim(task_id)
    late = runner.invoke(first, msg)
    assert late is not None and judge(late[0], late[1])[0] is not None  # a valid success
    expire_lease(services, task_id)  # the reaper takes attempt 1 back, and wakes a retry
    wait_for(lambda: services.dispatcher.get_task(task_id).status == "queued", 30, "reaped")
    second = by_hand.claim(task_id)
    assert second.attempt == 2
    runner.report(first, *late)
    view = services.dispatcher.get_task(task_id)
    assert (view.status, view.attempt, view.events) == ("running", 2, 0)
    assert attempt_errors(services, task_id)[0][0] == "lease_expired"
    got = runner.invoke(second, msg)
    assert got is not None
    runner.report(second, *got)
    view = services.dispatcher.get_task(task_id)
    assert (view.status, view.attempt, view.events) == ("succeeded", 2, 2)


# -- the answer, judged -----------------------------------------------------------------------
def claimed_payload(services: Services, output: uuid.UUID) -> TaskPayload:
    """The payload a claim reads of a fresh lambda task whose one output is `output`."""
    spec = TaskSpec(
        job="fn", operator="noop", runtime="lambda", outputs=[DatasetRef(dataset_uuid=output)]
    )
    task_id = services.dispatcher.create_task(spec).task_id
    req = ClaimRequest(task_id=task_id, worker_id="lambda:judge")
    c = services.dispatcher.claim(req, payload=True)
    assert c.task is not None
    return c.task


def test_an_answer_is_judged_as_an_untrusted_claim(services: Services) -> None:
    """Garbage, an answer over 6 MB, and outputs the Dispatcher did not assign each fail the
    attempt, saying why; a valid one passes with exactly what it claimed."""
    mine = uuid.uuid4()
    payload = claimed_payload(services, mine)
    ok = json.dumps({"outcome": "succeeded", "outputs": [{"dataset_uuid": str(mine)}]})
    result, kw = judge(payload, Reply(body=ok.encode()))
    assert result is not None and [o.dataset_uuid for o in kw["outputs"]] == [mine]
    cases = {
        b"Simple Lambda happy path OK": "lambda returned garbage",
        b'{"outcome": "succeeded", "extra": 1}': "lambda returned garbage",
        b"x" * (6 * 1024 * 1024 + 1): "over Lambda's 6,291,456",
        json.dumps(
            {"outcome": "succeeded", "outputs": [{"dataset_uuid": str(uuid.uuid4())}]}
        ).encode(): "names output(s) not assigned",
    }
    for body, why in cases.items():
        result, kw = judge(payload, Reply(body=body))
        assert result is None and why in kw["error"], (body[:40], kw)


# -- through boto3's Invoke, against moto ----------------------------------------------------
@pytest.fixture
def moto_lambda(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's real server with Lambda in its simple mode (no Docker: an invocation answers
    what was queued for it, else echoes its event), and a function named FUNCTION."""
    for k, v in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(k, v)
    httpx.post(f"{s3_endpoint}/moto-api/config", json={"lambda": {"use_docker": False}})
    iam = boto3.client("iam", region_name="us-east-1", endpoint_url=s3_endpoint)
    role_name = f"trace-fn-{uuid.uuid4().hex[:8]}"
    trust = {"Version": "2012-10-17", "Statement": []}
    role = iam.create_role(RoleName=role_name, AssumeRolePolicyDocument=json.dumps(trust))
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.writestr("handler.py", "def handler(event, context):\n    return event\n")
    aws = boto3.client("lambda", region_name="us-east-1", endpoint_url=s3_endpoint)
    name = f"{FUNCTION}-{uuid.uuid4().hex[:8]}"
    aws.create_function(
        FunctionName=name,
        Runtime="python3.11",
        Role=role["Role"]["Arn"],
        Handler="trace_platform.aws.lambda_handler.handler",
        Code={"ZipFile": code.getvalue()},
        Timeout=int(TIMEOUT),
    )
    yield name
    aws.delete_function(FunctionName=name)


def queue_answers(endpoint: str, *answers: str) -> None:
    r = httpx.post(
        f"{endpoint}/moto-api/static/lambda-simple/response",
        json={"results": list(answers), "region": "us-east-1"},
    )
    assert r.status_code == 201, r.text


def test_the_aws_invoker_calls_invoke_synchronously_without_retries(
    services: Services, s3_endpoint: str, moto_lambda: str
) -> None:
    """The function named, RequestResponse, the event as the payload (moto echoes it back),
    tried once. (moto's simple mode answers any function name, so a missing function's
    ResourceNotFoundException is not seen here: it fails the attempt as any refused Invoke.)"""
    invoker = AwsInvoker(moto_lambda, TIMEOUT, "us-east-1", s3_endpoint)
    calls: list[dict[str, Any]] = []
    invoker.client.meta.events.register(
        "before-call.lambda.Invoke", lambda params, **_: calls.append(params)
    )
    assert invoker.client.meta.config.retries["total_max_attempts"] == 1
    assert invoker.client.meta.config.read_timeout > TIMEOUT
    payload = claimed_payload(services, uuid.uuid4())
    event = json.dumps({"trace_lambda": 1, "task_id": str(payload.task_id)}).encode()
    reply = invoker.invoke(payload, event)
    assert reply == Reply(body=event)
    (call,) = calls
    assert call["url_path"].startswith(f"/2015-03-31/functions/{moto_lambda}/invocations")
    assert call["headers"]["X-Amz-Invocation-Type"] == "RequestResponse"
    assert call["body"] == event


def test_garbage_from_the_function_is_retried_until_a_valid_answer(
    services: Services,
    s3_endpoint: str,
    moto_lambda: str,
    run_with: Callable[[Invoker], LambdaRunner],
) -> None:
    """Through the whole loop and boto3's Invoke: attempt 1's answer is garbage (moto's default
    answer), attempt 2's a valid success."""
    queue_answers(s3_endpoint, "Simple Lambda happy path OK", json.dumps({"outcome": "succeeded"}))
    run_with(AwsInvoker(moto_lambda, TIMEOUT, "us-east-1", s3_endpoint))
    task_id = lambda_task(services, "noop", max_attempts=3)
    view = ended(services, task_id)
    assert (view.status, view.attempt) == ("succeeded", 2)
    (first, why), second = attempt_errors(services, task_id)
    assert first == "failed" and "lambda returned garbage" in why
    assert "Simple Lambda happy path OK" in why
    assert second == ("succeeded", "")


def test_a_function_error_is_the_invocations_failure() -> None:
    """What Lambda answers for a handler that ran out of time or raised (FunctionError
    "Unhandled", its error object as the payload: AWS's documented shape; moto's simple mode
    cannot make one)."""
    timed_out = answered(
        {"StatusCode": 200, "FunctionError": "Unhandled"},
        b'{"errorMessage": "2024-01-01T00:00:00.000Z 1f2e Task timed out after 900.00 seconds"}',
    )
    assert timed_out.body is None
    assert "Unhandled" in (timed_out.failure or "")
    assert "Task timed out after 900.00 seconds" in (timed_out.failure or "")
    raised = answered(
        {"StatusCode": 200, "FunctionError": "Unhandled"},
        b'{"errorMessage": "boom", "errorType": "RuntimeError", "stackTrace": []}',
    )
    assert "RuntimeError: boom" in (raised.failure or "")
    assert answered({"StatusCode": 200}, b"{}") == Reply(body=b"{}")


# -- Lite, zero configuration --------------------------------------------------------------
BUFFERED_DAG = """
name: feed
jobs:
  rule:
    operator: publish_rows
    runtime: lambda
    buffer_outputs: [rows]
    config: {dataset: rows, batches: [[{dedupe_key: a, n: 1}, {dedupe_key: b, n: 2}]]}
  reader:
    operator: noop
    inputs: [{from: {dataset: rows}}]
buffered:
  - name: rows
    columns: [{name: dedupe_key, type: text}, {name: n, type: int64}]
    unique_key: [dedupe_key]
    writers: [feed.rule]
"""


@pytest.mark.slow
def test_a_lite_stack_runs_a_lambda_job_with_no_configuration(settings: Settings, dsn: str) -> None:
    """`trace up`'s stack starts an invoker: the lambda job's batch, written through the
    local invoker's store proxy, lands through the sink, and its event runs the (container)
    reader on a platform worker."""
    env = {"TRACE_QUEUE_POLL_SECONDS": "0.2", "TRACE_OPERATOR_REGISTRY": "testing"}
    with LiteStack(settings, workers=1, sinks=1, deliverers=0, dsn=dsn, worker_env=env) as stack:
        svc = stack.services
        me = admin(svc)
        svc.control.deploy(me, BUFFERED_DAG)
        svc.control.trigger(me, "feed")

        def loaded() -> bool:
            recs = svc.control.list_buffers(me)
            return len(recs) == 1 and recs[0]["status"] == "loaded"

        wait_for(loaded, 120, "the lambda job's batch loaded by the sink")
        with svc.pool.connection() as conn:
            rows = conn.execute(
                "SELECT r.job, s.status, s.worker_id FROM task_registry r"
                " JOIN task_status s USING (task_id) ORDER BY r.job"
            ).fetchall()
        wait_for(
            lambda: svc.query.query(me, "SELECT count(*) FROM rows").as_json()["rows"] == [[2]],
            60,
            "the rows answer",
        )
        rule = [r for r in rows if r["job"] == "rule"]
        assert rule and all(r["worker_id"].startswith("lambda.") for r in rule), rows
        # The invoker is in the worker registry like any worker, under the id it claims with.
        with svc.pool.connection() as conn:
            members = conn.execute("SELECT worker_id, state, slots FROM workers").fetchall()
        invokers = [m for m in members if m["worker_id"].startswith("lambda.")]
        assert [m["worker_id"] for m in invokers] == [rule[0]["worker_id"]], members
        assert invokers[0]["state"] == "alive" and invokers[0]["slots"] >= 1


# -- the handler a user deploys ------------------------------------------------------------
def test_the_deployed_handler_runs_the_operator_on_its_store_held_to_the_task(
    services: Services, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`handler(event, context)` as Lambda calls it: its store from the function's environment
    (here Lite's directory), the operator's batch written below the attempt's own buffer prefix
    and returned for the invoker to publish; a key outside the task's scope is refused, and an
    event that is no Trace task fails for good without running anything."""
    from trace_platform.aws.lambda_handler import LambdaEvent, handler
    from trace_platform.aws.task_store import TaskStore
    from trace_platform.config import get_settings
    from trace_platform.layout import buffer_prefix
    from trace_platform.worker.store_proxy import StoreAccessDenied

    monkeypatch.setenv("TRACE_HOME", str(settings.home))
    monkeypatch.setenv("TRACE_OPERATOR_REGISTRY", "testing")
    get_settings.cache_clear()
    try:
        payload = claimed_payload(services, uuid.uuid4()).model_copy(
            update={"operator": "publish_rows", "config": {"dataset": "d", "batches": [[{"a": 1}]]}}
        )
        event = LambdaEvent(task=payload).model_dump(mode="json")
        result = handler(event, None)
    finally:
        get_settings.cache_clear()
    assert result["outcome"] == "succeeded", result
    (batch,) = result["buffers"]
    prefix = buffer_prefix(payload.org_id, payload.task_id, payload.attempt)
    assert batch["dataset"] == "d" and batch["location"].startswith(prefix)
    store = make_store(settings)
    assert store.get(batch["location"]) == b'{"a":1}\n'
    scoped = TaskStore(store, payload, settings.home)
    with pytest.raises(StoreAccessDenied):
        scoped.put(f"org/{payload.org_id}/buffers/task={uuid.uuid4()}/x.jsonl", b"{}")
    refused = handler({"task": "no"}, None)
    assert refused["outcome"] == "failed" and refused["retryable"] is False
    assert "not a Trace task event" in refused["error"]


# -- hostile timing and routing ----------------------------------------------------------------
def test_an_answer_after_a_cancel_lands_nothing(services: Services, by_hand: ByHand) -> None:
    """The user cancels a running lambda task; its heartbeat says so while the function runs
    (Lambda cannot be stopped). The function's success, answered after, lands nothing: the
    attempt ends canceled with no event, as a worker wrapper's canceled operator does."""
    runner = by_hand.runner
    task_id = lambda_task(services, "emit_events", count=2, final=1, sleep=2.5)
    msg = by_hand.wakeup()
    claim = by_hand.claim(task_id)
    services.dispatcher.cancel(task_id)  # the next heartbeat (within 1 s) answers it
    runner.run_claimed(claim, msg)
    assert runner.invocations == 1  # the function ran (the cancel came after the claim)
    view = services.dispatcher.get_task(task_id)
    assert (view.status, view.events) == ("canceled", 0)
    assert attempt_errors(services, task_id)[0][0] == "canceled"


def test_a_forged_wakeup_of_a_container_task_is_handed_back_not_invoked(
    services: Services, settings: Settings, driver: PgQueue, by_hand: ByHand
) -> None:
    """A wake-up on the lambda queue naming a task of another runtime (forged, or left by an
    older version): the invoker never runs it as a Lambda. Its claim is handed back at once
    (no try used) and the Dispatcher wakes it again on its own runtime's queue."""
    from trace_platform.queue import payloads

    runner = by_hand.runner
    spec = TaskSpec(job="box", operator="noop", outputs=[DatasetRef(dataset_uuid=uuid.uuid4())])
    task_id = services.dispatcher.create_task(spec).task_id
    assert services.dispatcher.get_task(task_id).status == "queued"
    driver.publish(settings.lambda_queue, payloads.encode(payloads.TaskWakeup(task_id=task_id)))
    runner.handle(by_hand.wakeup("the forgery"))
    assert runner.invocations == 0
    view = services.dispatcher.get_task(task_id)
    assert view.status == "queued", view
    with services.pool.connection() as conn:
        rows = conn.execute(
            "SELECT outcome, error FROM task_attempts WHERE task_id = %s", (task_id,)
        ).fetchall()
        woken = conn.execute(
            "SELECT count(*) AS n FROM outbox WHERE queue_name = %s AND payload->>'task_id' = %s",
            (settings.task_queue, str(task_id)),
        ).fetchone()
    assert [r["outcome"] for r in rows] == ["released"]
    assert "runtime ecs_platform" in rows[0]["error"], rows
    assert woken is not None and woken["n"] == 2  # its first wake-up, and the hand-back's
