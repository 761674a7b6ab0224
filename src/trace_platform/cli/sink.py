"""`trace sink` (the trusted loader of buffered datasets) and `trace buffers list`."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Annotated

import typer
from rich.table import Table

from trace_platform.cli.control import console, me, run_op, services
from trace_platform.cli.safe_text import safe

buffers_app = typer.Typer(help="Batches published to buffered datasets.", no_args_is_help=True)


def sink(
    dataset: Annotated[
        list[str] | None, typer.Option("--dataset", help="serve only these (default: all)")
    ] = None,
    once: Annotated[bool, typer.Option(help="load what is queued, then exit")] = False,
) -> None:
    """Run a sink: lease buffered-dataset batches, validate them, upsert them idempotently,
    emit each dataset's event. Safe to run several (per dataset, or all of them)."""
    from trace_platform.config import get_settings
    from trace_platform.db.pool import sink_dsn, state_dsn
    from trace_platform.dispatcher.core import Dispatcher
    from trace_platform.objectstore import make_store
    from trace_platform.queue import make_driver
    from trace_platform.sink.service import Sink
    from trace_platform.store.tasks.postgres import PostgresStore

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = get_settings()
    dsn = state_dsn(settings)
    store = make_store(settings)
    store.ensure_bucket()
    s = Sink(
        Dispatcher(PostgresStore.connect(dsn, max_size=2), settings),
        make_driver(settings, dsn),
        store,
        sink_dsn(settings, dsn),  # the least-privilege sink login, never the state one
        datasets=dataset or [],
    )
    if once:
        console.print(f"{s.drain()} batch message(s) handled")
        return
    stop = threading.Event()  # SIGTERM / Ctrl-C: stop between batches
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    s.serve(stop)


@buffers_app.command("list")
def buffers_list(
    dataset: Annotated[str | None, typer.Option(help="only this dataset")] = None,
    status: Annotated[str | None, typer.Option(help="pending, loaded or dead")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
) -> None:
    """Published batches, newest first; a dead one says why the sink refused it."""
    table = Table("record", "dataset", "status", "dag.job", "task", "rows", "error")
    for r in run_op(
        services().control.list_buffers, me(), dataset=dataset, status=status, limit=limit
    ):
        rows = "-" if r["rows_read"] is None else f"{r['rows_loaded']}/{r['rows_read']}"
        table.add_row(
            str(r["record_id"]),
            safe(r["dataset"]),
            r["status"],
            safe(f"{r['dag']}.{r['job']}"),
            f"{r['task_id']}.{r['attempt']}",
            rows,
            safe(r["error"] or ""),
        )
    console.print(table)
