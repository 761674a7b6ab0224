"""`trace lambda-invoker`: the lambda runtime's invoker (aws/lambda_runner.py)."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Annotated

import typer

from trace_platform.cli.control import fail


def lambda_invoker(
    api_url: Annotated[str | None, typer.Option(help="Dispatcher API URL")] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="invocations at once (TRACE_LAMBDA_CONCURRENCY)")
    ] = None,
) -> None:
    """Run the Lambda invoker: take the wake-ups of runtime `lambda` tasks, claim each as a
    worker does, invoke the function (TRACE_LAMBDA_INVOKER: local, a sandboxed subprocess; aws,
    Lambda's Invoke), report its answer attempt-fenced. SIGTERM: no new task; the invocations
    under way are waited for and reported."""
    from trace_platform.aws.invokers import make_invoker
    from trace_platform.aws.lambda_runner import LambdaRunner
    from trace_platform.config import get_settings
    from trace_platform.db.pool import state_dsn
    from trace_platform.lite.bootstrap import internal_token, internal_token_file
    from trace_platform.objectstore import make_store
    from trace_platform.queue import make_driver
    from trace_platform.sandbox import Policy, SandboxUnavailable, resolve
    from trace_platform.sandbox.hostdir import operator_host_env, resource_limits
    from trace_platform.tls import worker_tls
    from trace_platform.worker.client import DispatcherClient
    from trace_platform.worker.membership import Membership, advertised_host, new_worker_id

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = get_settings()
    url = api_url or settings.resolved_api_url
    try:  # before anything starts: how it reaches the API, and what it calls itself
        tls = worker_tls(settings, url)
        host = advertised_host(settings)
    except ValueError as e:
        fail(str(e))
    token = internal_token(settings)
    if token is None:
        fail(
            f"no internal token: set TRACE_INTERNAL_TOKEN or start the API once (Lite writes "
            f"{internal_token_file(settings)})"
        )
    policy = Policy("off")  # the aws invoker runs nothing here
    if settings.lambda_invoker == "local":
        try:
            policy = resolve(settings)
        except SandboxUnavailable as e:
            fail(str(e))
    store = make_store(settings)
    store.ensure_bucket()
    invoker = make_invoker(
        settings,
        store,
        policy,
        extra_env=operator_host_env(settings),
        limits=resource_limits(settings),
    )
    n = concurrency or settings.lambda_concurrency
    driver = make_driver(settings, state_dsn(settings))
    client = DispatcherClient(url, internal_token=token, wrappers=n, tls=tls)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # In the worker registry like any worker (docs/workers.md): one on a host that dies is
    # seen within three beats and its invocations' attempts retried; declared dead, it stops.
    member = Membership(
        client,
        host=host,
        slots=n,
        beat_seconds=settings.worker_beat_seconds,
        on_dead=lambda why: stop.set(),
        worker_id=new_worker_id(f"lambda.{host}"),
    ).start()
    runner = LambdaRunner(
        driver,
        client,
        invoker,
        queue_name=settings.lambda_queue,
        concurrency=n,
        visibility_seconds=settings.worker_visibility_seconds,
        wait_seconds=min(2.0, settings.queue_poll_seconds * 5),
        worker_id=member.worker_id,
    )
    try:
        runner.run(stop)
    finally:
        member.stop()
        invoker.close()
    if member.dead is not None:
        fail(f"lambda invoker {member.worker_id} was declared dead: {member.dead}")
        client.close()
        driver.close()
