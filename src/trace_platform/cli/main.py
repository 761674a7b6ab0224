"""The `trace` command line."""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import threading
import time
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.console import Console
from rich.table import Table

from trace_platform.cli import changes as _changes  # noqa: F401 - registers `trace dag` change commands
from trace_platform.cli.admin import admin_app
from trace_platform.cli.audit import audit_app
from trace_platform.cli.control import (
    dag_app,
    datasets_app,
    fail,
    me,
    run_op,
    runs_app,
    secrets_app,
    services,
    users_app,
)
from trace_platform.cli.delivery import alerts_app, deliveries_app, delivery, destinations_app
from trace_platform.cli.devnet import devnet_app
from trace_platform.cli.identity import keys_app  # also registers `trace users list|remove`
from trace_platform.cli.lambda_invoker import lambda_invoker
from trace_platform.cli.names import names_app
from trace_platform.cli.query import query
from trace_platform.cli.safe_text import safe
from trace_platform.cli.sink import buffers_app, sink
from trace_platform.cli.verify import verify
from trace_platform.cli.workers import workers_app
from trace_platform.config import Settings, get_settings, shown
from trace_platform.contract import TaskSpec
from trace_platform.db.embedded import EmbeddedPostgresError
from trace_platform.db.migrate import migrate
from trace_platform.db.pool import embedded_cluster, make_pool, sink_dsn, state_dsn
from trace_platform.dispatcher.models import TaskView
from trace_platform.sandbox.hostdir import operator_host_env

app = typer.Typer(
    help="Trace: a Postgres-centred data platform for chain data.", no_args_is_help=True
)
db_app = typer.Typer(help="The embedded Postgres (Lite).", no_args_is_help=True)
task_app = typer.Typer(help="Tasks: create, watch, cancel.", no_args_is_help=True)
config_app = typer.Typer(help="Configuration.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(task_app, name="task")
app.add_typer(config_app, name="config")
app.add_typer(dag_app, name="dag")
app.add_typer(runs_app, name="runs")
app.add_typer(datasets_app, name="datasets")
app.add_typer(secrets_app, name="secrets")
app.add_typer(users_app, name="users")
app.add_typer(keys_app, name="keys")
app.add_typer(devnet_app, name="devnet")
app.add_typer(names_app, name="names")
app.add_typer(buffers_app, name="buffers")
app.command("sink")(sink)
app.add_typer(destinations_app, name="destinations")
app.add_typer(deliveries_app, name="deliveries")
app.add_typer(alerts_app, name="alerts")
app.add_typer(workers_app, name="workers")
app.add_typer(admin_app, name="admin")
app.add_typer(audit_app, name="audit")
app.command("delivery")(delivery)
app.command("query")(query)
app.command("verify")(verify)
app.command("lambda-invoker")(lambda_invoker)

console = Console()


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _drain_on_signals(grace: float) -> tuple[threading.Event, threading.Event]:
    """(stop, abort): the first SIGTERM/SIGINT stops taking work and, `grace` seconds later,
    aborts what still runs (handed back); a second signal aborts at once."""
    stop, abort = threading.Event(), threading.Event()

    def handler(signum: int, _frame: object) -> None:
        if stop.is_set():
            abort.set()
            return
        stop.set()
        logging.getLogger(__name__).info(
            "draining: no new tasks; running ones have %.0fs to finish", grace
        )
        timer = threading.Timer(grace, abort.set)
        timer.daemon = True  # a worker drained before the grace ends exits at once
        timer.start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop, abort


# -- config ------------------------------------------------------------------------------
@config_app.command("show")
def config_show(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Print the resolved configuration (secrets masked)."""
    data = shown(get_settings())
    if as_json:
        console.print_json(json.dumps(data))
        return
    table = Table("setting", "value", title="trace config")
    for k, v in data.items():
        table.add_row(k, safe(v))
    console.print(table)


# -- db ----------------------------------------------------------------------------------
def _cluster(settings: Settings) -> Any:
    if not settings.uses_embedded_postgres:
        fail("TRACE_STATE_DSN is set: the database is external, not managed by trace")
    try:
        return embedded_cluster(settings)
    except EmbeddedPostgresError as e:
        fail(str(e))


@db_app.command("start")
def db_start() -> None:
    """Start (initialising on first use) the embedded Postgres and migrate it."""
    pg = _cluster(get_settings())
    try:
        pg.start()
    except EmbeddedPostgresError as e:
        fail(str(e))
    applied = migrate(pg.dsn())
    console.print(f"embedded Postgres running on 127.0.0.1:{pg.info().port} (data: {pg.root})")
    if applied:
        console.print(f"applied migrations: {', '.join(applied)}")


@db_app.command("stop")
def db_stop() -> None:
    """Stop the embedded Postgres (data is kept)."""
    _cluster(get_settings()).stop()
    console.print("embedded Postgres stopped")


@db_app.command("status")
def db_status() -> None:
    """Show where the embedded Postgres lives and whether it runs."""
    st = _cluster(get_settings()).status()
    table = Table("key", "value", title="embedded Postgres")
    for k, v in st.items():
        table.add_row(k, str(v))
    console.print(table)


@db_app.command("migrate")
def db_migrate() -> None:
    """Apply pending migrations to the state database."""
    dsn = state_dsn(get_settings(), run_migrations=False)
    applied = migrate(dsn)
    console.print(f"applied: {', '.join(applied) or 'nothing (up to date)'}")


# -- processes ---------------------------------------------------------------------------
@app.command("api")
def serve_api(
    port: Annotated[int | None, typer.Option(help="listen port")] = None,
    background: Annotated[bool, typer.Option(help="run outbox publisher + reaper here")] = True,
) -> None:
    """Run the API + Dispatcher (outbox publisher and reaper loops) in the foreground."""
    import uvicorn

    from trace_platform.api.app import create_app
    from trace_platform.services import Services
    from trace_platform.tls import uvicorn_tls

    settings = get_settings()
    try:
        tls = uvicorn_tls(settings)  # https with TRACE_API_TLS_CERT/KEY (docs/tls.md)
    except ValueError as e:
        fail(str(e))
    services = Services.build(settings)
    uvicorn.run(
        create_app(services, background=background),
        host=settings.api_host,
        port=port or settings.api_port,
        log_level="info",
        **tls,
    )


@app.command("worker")
def worker(
    api_url: Annotated[str | None, typer.Option(help="Dispatcher API URL")] = None,
    concurrency: Annotated[int, typer.Option(min=1)] = 1,
    exchange_url: Annotated[
        str | None,
        typer.Option(help="the API's exchange listener (TRACE_EXCHANGE_URL); else its route"),
    ] = None,
    max_tasks: Annotated[int | None, typer.Option(help="exit after this many tasks")] = None,
) -> None:
    """Run a worker: receive wake-ups, claim, run operators, report. SIGTERM drains: no new
    tasks, running ones get TRACE_WORKER_DRAIN_SECONDS (30) to finish, then are handed back
    unfinished without spending a retry; a second signal hands them back at once."""
    from trace_platform.lite.bootstrap import internal_token, internal_token_file
    from trace_platform.metrics.worker import serve_worker_metrics
    from trace_platform.objectstore import make_store
    from trace_platform.queue import make_driver
    from trace_platform.sandbox import SandboxUnavailable, resolve
    from trace_platform.tls import worker_tls
    from trace_platform.worker.client import DispatcherClient
    from trace_platform.worker.held_acks import HeldAcks
    from trace_platform.worker.membership import Membership, advertised_host
    from trace_platform.worker.reactor import Reactor, loop_client
    from trace_platform.worker.task_network import platform_ports
    from trace_platform.worker.wrapper import Wrapper

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # SIGUSR1: every thread's stack to the log (a worker slow to exit can be asked where it is).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    settings = get_settings()
    url = api_url or settings.resolved_api_url
    exchange = exchange_url or settings.exchange_url
    # Before anything starts: how it reaches the API, and what it calls itself.
    try:
        tls = worker_tls(settings, url, exchange)
        host = advertised_host(settings)
    except ValueError as e:
        fail(str(e))
    try:
        policy = resolve(settings)
    except SandboxUnavailable as e:
        fail(str(e))
    dsn = state_dsn(settings)
    driver = make_driver(settings, dsn)
    # Trusted sinks (and only they) get Postgres data access, for the task's run only, as the
    # least-privilege sink login (TRACE_DATA_DSN, else the embedded cluster's trace_sink).
    data_dsn = sink_dsn(settings, dsn)
    token = internal_token(settings)
    if token is None:
        fail(
            f"no internal token: set TRACE_INTERNAL_TOKEN or start the API once (Lite writes "
            f"{internal_token_file(settings)})"
        )
    # Its claims, reports, heartbeats and hosts, on TRACE_WORKER_METRICS_PORT when set.
    metrics, metrics_server = serve_worker_metrics(settings)
    client = DispatcherClient(
        url,
        internal_token=token,
        wrappers=concurrency,
        exchange_url=exchange,
        tls=tls,
        metrics=metrics,
    )
    store = make_store(settings)
    store.ensure_bucket()
    stop, abort = _drain_on_signals(settings.worker_drain_seconds)

    def declared_dead(why: str) -> None:  # its attempts were ended: stop at once
        stop.set()
        abort.set()

    # Registered in the worker registry, beating on its own thread (docs/workers.md).
    member = Membership(
        client,
        host=host,
        slots=concurrency,
        beat_seconds=settings.worker_beat_seconds,
        on_dead=declared_dead,
    ).start()
    # One for all wrappers: their wake-ups come in one receive, which acks what it holds.
    wait_seconds = min(2.0, settings.queue_poll_seconds * 5)
    acks = HeldAcks(driver, settings.task_queue)
    wrappers = [
        Wrapper(
            driver,
            client,
            store,
            policy=policy,
            queue_name=settings.task_queue,
            home=settings.home,
            visibility_seconds=settings.worker_visibility_seconds,
            host_env=operator_host_env(settings),
            trusted_env={"TRACE_SINK_DSN": data_dsn},
            platform_ports=platform_ports(settings, [url, exchange], [dsn, data_dsn]),
            extra_binds=settings.sandbox_extra_binds,
            wait_seconds=wait_seconds,
            acks=acks,
            # Every wrapper claims as the worker (the registry's id); each has its own hosts.
            worker_id=member.worker_id,
            host_name=f"{member.worker_id}-{i}",
            metrics=metrics,
        )
        for i in range(concurrency)
    ]
    # One thread drives them all (worker/reactor.py): this one, where signals are handled.
    own = loop_client(url, token, exchange, tls, metrics)
    Reactor(wrappers, own).run(stop, max_tasks, abort)
    member.stop()
    if metrics_server is not None:
        metrics_server.stop()
    own.close()
    client.close()
    driver.close()
    if member.dead is not None:
        fail(f"worker {member.worker_id} was declared dead: {member.dead}")


@app.command("scheduler")
def scheduler() -> None:
    """Run only the cron scheduler (safe to run several: each tick fires once)."""
    from trace_platform.dispatcher.core import Dispatcher
    from trace_platform.triggers.cron import run_scheduler

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = get_settings()
    pool = make_pool(state_dsn(settings), max_size=2, name="scheduler")
    run_scheduler(
        Dispatcher(pool, settings), _stop_on_signals(), settings.scheduler_interval_seconds
    )


@app.command("up")
def up(
    workers: Annotated[int, typer.Option(min=0)] = 2,
    port: Annotated[int | None, typer.Option()] = None,
) -> None:
    """Run the Lite stack locally (API + Dispatcher, N workers, a sink, a Delivery Service)
    until Ctrl-C."""
    from trace_platform.lite.stack import LiteStack

    settings = get_settings()
    stack = LiteStack(settings, workers=workers, port=port or settings.api_port)
    stop = _stop_on_signals()
    try:
        stack.start()
    except Exception as e:
        stack.stop()
        fail(str(e))
    if stack.services.new_admin_key:
        console.print(
            "[bold yellow]Created the Lite admin API key[/bold yellow] (shown once, saved to "
            f"{settings.home / 'admin.key'}):\n  {stack.services.new_admin_key}"
        )
    console.print(
        f"[green]Trace Lite up[/green]: API {stack.url}, {workers} worker(s). Ctrl-C stops."
    )
    try:
        while not stop.wait(1.0):
            for i in stack.exited_workers():
                console.print(f"worker {i} exited; restarting it")
                stack.restart_worker(i)
    finally:
        console.print("stopping…")
        stack.stop()


# -- tasks -------------------------------------------------------------------------------
# Thin shells over the control plane, acting as the CLI's user (as the API does): the same
# permission checks, one code path.
def print_task(view: TaskView) -> None:
    table = Table(title=f"task {view.task_id}", show_header=False)
    # Job, operator, config and errors are the caller's and the operator's text.
    for key in (
        "job",
        "operator",
        "runtime",
        "status",
        "attempt",
        "max_attempts",
        "created_at",
        "finished_at",
        "next_attempt_at",
        "last_error",
        "events",
    ):
        table.add_row(key, safe(getattr(view, key)))
    table.add_row("config", safe(json.dumps(view.config)))
    console.print(table)
    if view.attempts:
        at = Table("attempt", "worker", "started", "duration", "outcome", "error", title="attempts")
        for a in view.attempts:
            dur = f"{(a.finished_at - a.started_at).total_seconds():.2f}s" if a.finished_at else "…"
            at.add_row(
                str(a.attempt),
                safe(a.worker_id or ""),
                a.started_at.strftime("%H:%M:%S"),
                dur,
                safe(a.outcome),
                safe((a.error or "")[:80]),
            )
        console.print(at)


@task_app.command("create")
def task_create(
    job: Annotated[str, typer.Option(help="job name")],
    operator: Annotated[str, typer.Option(help="operator name (noop, sleep, fail, emit_events)")],
    config: Annotated[str, typer.Option(help="operator config as JSON")] = "{}",
    timeout: Annotated[int | None, typer.Option(help="timeout_seconds")] = None,
    max_attempts: Annotated[int | None, typer.Option()] = None,
    wait: Annotated[bool, typer.Option(help="follow the task until it finishes")] = False,
) -> None:
    """Create one ad-hoc task (org admins only) and print its id."""
    try:
        spec = TaskSpec(
            job=job,
            operator=operator,
            config=json.loads(config),
            timeout_seconds=timeout,
            max_attempts=max_attempts,
        )
    except json.JSONDecodeError as e:
        fail(f"--config is not valid JSON: {e}")
    except ValueError as e:
        fail(str(e))
    cp, actor = services().control, me()
    ref = run_op(cp.create_task, actor, spec)
    console.print(f"task {ref.task_id} queued")
    if wait:
        last = None
        while True:
            view = run_op(cp.get_task, actor, ref.task_id)
            state = (view.status, view.attempt)
            if state != last:
                console.print(
                    f"  {time.strftime('%H:%M:%S')} {view.status} (attempt {view.attempt})"
                )
                last = state
            if view.status in ("succeeded", "failed", "canceled"):
                break
            time.sleep(0.2)
        print_task(view)


@task_app.command("show")
def task_show(task_id: UUID) -> None:
    """Show one task: definition, status, attempts."""
    print_task(run_op(services().control.get_task, me(), task_id))


@task_app.command("cancel")
def task_cancel(task_id: UUID) -> None:
    """Cancel a task (cooperatively, if it is running)."""
    res = run_op(services().control.cancel_task, me(), task_id)
    console.print(
        f"task {task_id}: {safe(res.status)}"
        + (" (cancel requested)" if res.status == "running" else "")
    )


@task_app.command("list")
def task_list(limit: Annotated[int, typer.Option()] = 20) -> None:
    """Most recent tasks of your org (org admins only)."""
    rows = run_op(services().control.list_tasks, me(), limit)
    table = Table("task", "job", "operator", "status", "attempt", "created", "last error")
    for r in rows:
        table.add_row(
            str(r["task_id"]),
            safe(r["job"]),
            safe(r["operator"]),
            safe(r["status"]),
            str(r["attempt"]),
            r["created_at"].strftime("%H:%M:%S"),
            safe((r["last_error"] or "")[:60]),
        )
    console.print(table)


@app.command("demo")
def demo(
    rpc_url: Annotated[
        str | None, typer.Option(help="a real chain's RPC (default: the local devnet)")
    ] = None,
    token: Annotated[str | None, typer.Option(help="the ERC20 token to analyse")] = None,
    from_block: Annotated[int | None, typer.Option(min=0)] = None,
    to_block: Annotated[int | None, typer.Option(min=0)] = None,
    chunk_size: Annotated[
        int | None, typer.Option(min=1, help="blocks per range (default 500, or as last synced)")
    ] = None,
    workers: Annotated[int, typer.Option(min=1)] = 2,
    devnet_seed: Annotated[
        int | None,
        typer.Option(help="the devnet's activity seed (another seed: another chain, same id)"),
    ] = None,
) -> None:
    """The Monad demo: sync a chain range, analyse it, print the analytics and charts. Data
    already synced is reused only if the node still has the same blocks (hashes compared)."""
    from trace_platform.devnet import ChainSpec
    from trace_platform.lite.demo import run_demo

    raise typer.Exit(
        run_demo(
            get_settings(),
            rpc_url=rpc_url,
            token=token,
            from_block=from_block,
            to_block=to_block,
            chunk_size=chunk_size,
            workers=workers,
            console=console,
            devnet_spec=ChainSpec(seed=devnet_seed) if devnet_seed is not None else None,
        )
    )


if __name__ == "__main__":
    app()
