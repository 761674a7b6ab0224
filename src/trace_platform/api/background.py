"""What an API process may run beside its routes: the outbox publisher, the reaper, the
automatic cutover of completed rebuilds, the collector of retired files and the cron
scheduler, each a daemon thread started and stopped by the app's lifespan; and the workers'
exchange listener (api/exchange_listener.py) and the /metrics listener (metrics/api.py) when
the settings give them a port."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI

from trace_platform.api.exchange_listener import ExchangeListener
from trace_platform.control.changes import run_cutovers
from trace_platform.db.pool import sink_dsn
from trace_platform.dispatcher.reaper import run_reaper
from trace_platform.metrics.api import serve_metrics
from trace_platform.objectstore import make_store
from trace_platform.registry.collector import Collector, run_collector
from trace_platform.services import Services
from trace_platform.tls import server_context
from trace_platform.triggers.cron import run_scheduler

log = logging.getLogger(__name__)


def background_threads(services: Services, stop: threading.Event) -> list[threading.Thread]:
    """The publisher, reaper, cutover and scheduler threads (not started), all ending when
    `stop` is set."""
    s = services.settings
    collector = Collector(
        services.pool,
        make_store(s),
        sink_dsn(s, services.dsn),  # not the state login: it can drop dataset tables only
        grace_seconds=s.collector_grace_seconds,
        batch_size=s.collector_batch_size,
        dead_retention_seconds=s.collector_dead_batch_retention_seconds,
    )
    return [
        threading.Thread(
            target=services.publisher.run,
            args=(stop, services.dsn, s.queue_poll_seconds),
            name="outbox-publisher",
            daemon=True,
        ),
        threading.Thread(
            target=run_reaper,
            args=(services.dispatcher, stop, s.reaper_interval_seconds),
            name="reaper",
            daemon=True,
        ),
        threading.Thread(
            target=run_cutovers,
            args=(services.control.changes, stop, s.cutover_interval_seconds),
            name="cutover",
            daemon=True,
        ),
        threading.Thread(
            target=run_scheduler,
            args=(services.dispatcher, stop, s.scheduler_interval_seconds),
            name="scheduler",
            daemon=True,
        ),
        # Deletes retired locations once no commit and no live query pin can reach them.
        threading.Thread(
            target=run_collector,
            args=(collector, stop, s.collector_interval_seconds),
            name="collector",
            daemon=True,
        ),
    ]


def exchange_listener(services: Services) -> ExchangeListener | None:
    """The workers' exchange listener, serving, when the settings give it a port."""
    s = services.settings
    if s.exchange_port is None:
        return None
    token = services.internal_token or ""
    try:
        listener = ExchangeListener(
            services.dispatcher, token, s.api_host, s.exchange_port, server_context(s)
        )
    except OSError as e:  # an optimisation, never a dependency: the API serves on without it
        log.warning(
            "the exchange listener cannot listen on %s:%d (%s); workers use the API's route",
            s.api_host,
            s.exchange_port,
            e,
        )
        return None
    return listener.start()


def lifespan(
    services: Services, *, background: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the exchange listener (if configured) and, with `background`, the
    loops run while the app serves; on shutdown the listener stops and the loops are told to
    stop and given five seconds each."""

    stop = threading.Event()
    threads: list[threading.Thread] = []

    @asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[None]:
        listener = None
        # The caches of mutable answers (API keys) and the listener that keeps them true.
        services.listen()
        metrics = None
        try:
            listener = app.state.exchange_listener = exchange_listener(services)
            if hasattr(app.state, "metrics"):  # create_app's (not the hooks-only app's)
                metrics = app.state.metrics_server = serve_metrics(services, app.state.metrics)
            if background:
                threads.extend(background_threads(services, stop))
                for t in threads:
                    t.start()
            yield
        finally:
            if listener is not None:
                listener.stop()
            if metrics is not None:
                metrics.stop()
            stop.set()
            for t in threads:
                t.join(timeout=5)

    return run
