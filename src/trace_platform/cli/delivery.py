"""`trace delivery` (the Delivery Service), `trace destinations`, `trace deliveries` and
`trace alerts`."""

from __future__ import annotations

import json
import logging
import signal
import threading
from typing import Annotated
from uuid import UUID

import typer
from rich.table import Table

from trace_platform.cli.control import console, me, run_op, services
from trace_platform.cli.safe_text import safe

destinations_app = typer.Typer(
    help="Where alerts are delivered (webhooks; admins).", no_args_is_help=True
)
deliveries_app = typer.Typer(
    help="Alert deliveries and their attempts (admins).", no_args_is_help=True
)
alerts_app = typer.Typer(help="The org's alerts (alert_events).", no_args_is_help=True)


def _control():  # type: ignore[no-untyped-def]
    from trace_platform.delivery.control import DeliveryControl
    from trace_platform.identity.vault import vault_for

    svc = services()
    return DeliveryControl(svc.pool, vault_for(svc.settings))


def delivery(
    once: Annotated[bool, typer.Option(help="send what is due, then exit")] = False,
) -> None:
    """Run a Delivery Service: lease due deliveries, send them as signed webhooks, retry,
    record every attempt. Safe to run several."""
    from trace_platform.config import get_settings
    from trace_platform.db.pool import make_pool, sink_dsn, state_dsn
    from trace_platform.delivery.service import DeliveryService
    from trace_platform.identity.vault import vault_for
    from trace_platform.queue import make_driver
    from trace_platform.worker.task_network import platform_ports

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = get_settings()
    dsn = state_dsn(settings)
    pool = make_pool(dsn, max_size=10)  # the loop and its concurrent sends' settling
    driver = make_driver(settings, dsn)
    ports = platform_ports(settings, [settings.resolved_api_url], [dsn, sink_dsn(settings, dsn)])
    svc = DeliveryService(pool, driver, vault_for(settings), settings, platform_ports=ports)
    try:
        if once:
            console.print(f"{svc.drain(60)} delivery attempt(s)")
            return
        stop = threading.Event()  # SIGTERM / Ctrl-C: stop between attempts
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        svc.serve(stop)
    finally:
        svc.close()
        driver.close()
        pool.close()


@destinations_app.command("add")
def destinations_add(
    name: Annotated[str, typer.Argument(help="the destination's name (routes use it)")],
    url: Annotated[str, typer.Argument(help="http(s) URL the webhooks are POSTed to")],
    allow_private: Annotated[
        bool,
        typer.Option(
            "--allow-private",
            help="allow a loopback, private or link-local address (or a platform port)",
        ),
    ] = False,
) -> None:
    """Add a webhook destination; prints its signing secret once (Standard Webhooks)."""
    secret = run_op(_control().add_destination, me(), name, url, allow_private=allow_private)
    console.print(f"destination '{safe(name)}' added. Signing secret (shown once):")
    console.print(f"  {secret}", highlight=False)


@destinations_app.command("list")
def destinations_list() -> None:
    """The org's destinations."""
    table = Table("name", "url", "enabled", "private allowed", "updated")
    for d in run_op(_control().list_destinations, me()):
        table.add_row(
            safe(d["name"]),
            safe(d["url"]),
            "yes" if d["enabled"] else "no",
            "yes" if d["allow_private"] else "",
            str(d["updated_at"])[:19],
        )
    console.print(table)


@destinations_app.command("disable")
def destinations_disable(name: str) -> None:
    """Hold a destination's deliveries (they wait, retried, until enabled or too old)."""
    run_op(_control().set_destination, me(), name, enabled=False)
    console.print(f"destination '{safe(name)}' disabled")


@destinations_app.command("enable")
def destinations_enable(name: str) -> None:
    run_op(_control().set_destination, me(), name, enabled=True)
    console.print(f"destination '{safe(name)}' enabled")


@destinations_app.command("rotate-secret")
def destinations_rotate_secret(name: str) -> None:
    """A new signing secret for a destination (printed once; the old one stops verifying)."""
    secret = run_op(_control().set_destination, me(), name, rotate_secret=True)
    console.print(f"destination '{safe(name)}': new signing secret (shown once):")
    console.print(f"  {secret}", highlight=False)


@deliveries_app.command("list")
def deliveries_list(
    status: Annotated[
        str | None, typer.Option(help="suppressed, pending, sending, delivered or failed")
    ] = None,
    destination: Annotated[str | None, typer.Option(help="only this destination")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
) -> None:
    """Deliveries, newest first."""
    table = Table("delivery", "destination", "rule", "severity", "status", "tries", "reason")
    rows = run_op(
        _control().list_deliveries, me(), status=status, destination=destination, limit=limit
    )
    for d in rows:
        table.add_row(
            str(d["delivery_id"]),
            safe(d["destination"]),
            safe(d["rule"]),
            d["severity"],
            d["status"],
            str(d["attempts"]),
            safe((d["reason"] or "")[:80]),
        )
    console.print(table)


@deliveries_app.command("show")
def deliveries_show(delivery_id: UUID) -> None:
    """A delivery: its idempotency key, body and every attempt."""
    d = run_op(_control().show, me(), delivery_id)
    for k in (
        "delivery_id",
        "idempotency_key",
        "destination",
        "rule",
        "severity",
        "event_time",
        "status",
        "reason",
        "attempts",
        "next_attempt_at",
        "created_at",
        "finished_at",
    ):
        console.print(f"{k}: {safe(str(d[k]))}", highlight=False)
    console.print("body: " + safe(json.dumps(json.loads(d["body"]), indent=2)), highlight=False)
    table = Table("attempt", "finished", "outcome", "HTTP", "ms", "address", "error")
    for a in d["attempt_log"]:
        table.add_row(
            str(a["attempt"]),
            str(a["finished_at"])[:19],
            a["outcome"],
            str(a["status_code"] or ""),
            str(a["latency_ms"] or ""),
            safe(a["address"] or ""),
            safe((a["error"] or "")[:80]),
        )
    console.print(table)


@deliveries_app.command("retry")
def deliveries_retry(delivery_id: UUID) -> None:
    """Send a failed delivery again (the same idempotency key and body)."""
    run_op(_control().retry, me(), delivery_id)
    console.print(f"delivery {delivery_id} pending again")


@alerts_app.command("list")
def alerts_list(
    rule: Annotated[str | None, typer.Option(help="only this rule")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
) -> None:
    """The org's alerts ("would have alerted" included), newest first: alert_events through
    the Query Service (its read_roles apply)."""
    from trace_platform.delivery.control import alerts_sql

    sql = run_op(alerts_sql, rule, limit)
    res = run_op(services().query.query, me(), sql).as_json()
    table = Table(*(c["name"] for c in res["columns"]))
    for row in res["rows"]:
        table.add_row(*(safe(str(v))[:80] for v in row))
    console.print(table)
