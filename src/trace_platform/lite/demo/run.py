"""`trace demo`: plan, start the Lite stack, deploy, backfill unless the data is complete,
report."""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trace_platform.config import Settings
from trace_platform.lite.demo.alerts import settle, start_receiver
from trace_platform.lite.demo.backfill import backfill, stage_of
from trace_platform.lite.demo.dag import DEMO_DAG, dag_text
from trace_platform.lite.demo.data import admin, chain_changes, complete
from trace_platform.lite.demo.phases import Phases
from trace_platform.lite.demo.plan import (
    chain_plan,
    devnet_plan,
    keep_boundaries,
    last_run,
    save_run,
)
from trace_platform.lite.demo.report import analytics, where
from trace_platform.lite.stack import LiteStack, egress_allow


def run_demo(
    settings: Settings,
    *,
    rpc_url: str | None = None,
    token: str | None = None,
    from_block: int | None = None,
    to_block: int | None = None,
    chunk_size: int | None = None,
    workers: int = 2,
    console: Console | None = None,
    devnet_spec: Any = None,
) -> int:
    console = console or Console()
    if not console.is_terminal:  # logs and CI: wide enough for the tables
        console.width = max(console.width, 160)
    phases = Phases()
    state_file = settings.home / "demo" / "last.json"
    devnet = None
    previous = last_run(state_file)
    if rpc_url is None:
        from trace_platform.devnet import ChainSpec

        spec = devnet_spec or ChainSpec()
        plan = devnet_plan(from_block, to_block, chunk_size or 500, previous, spec)
    else:
        if token is None or from_block is None or to_block is None:
            console.print("[red]error:[/red] --rpc-url needs --token, --from-block and --to-block")
            return 2
        plan = chain_plan(rpc_url, token, from_block, to_block, chunk_size or 500)
    refused = keep_boundaries(plan, previous, chunk_size)
    if refused:
        console.print(f"[red]error:[/red] {refused}")
        return 2
    console.print(
        "[bold]Starting Trace Lite[/bold] (embedded Postgres, object store, API, workers)…"
    )
    # The RPC the admin named on the command line is theirs to allow (a node on loopback or a
    # private network is refused otherwise); the stack adds its own devnet by itself.
    worker_env = {"TRACE_EGRESS_ALLOW": allow_also(rpc_url)} if rpc_url else {}
    # The devnet's few thousand rows: Spark's JVMs on the quick compiler profile (half their
    # CPU), unless the environment chose one (TRACE_SPARK_JIT).
    if rpc_url is None:
        worker_env["TRACE_SPARK_JIT"] = os.environ.get("TRACE_SPARK_JIT", "quick")
    with phases.phase("start the stack"):
        stack = LiteStack(settings, workers=workers, worker_env=worker_env).start()
    receiver = None
    try:
        svc = stack.services
        console.print(f"API at {stack.url}; objects under {settings.object_store_root}")
        receiver = start_receiver(svc, admin(svc))  # where the demo's alerts are delivered
        if rpc_url is None:
            # Up first: the data on hand is complete only if the chain under it is the same.
            with phases.phase("devnet: generate the chain"):
                devnet, plan.rpc_url, plan.token = _start_devnet(settings, console, spec)
        with phases.phase("deploy the DAG"):
            svc.control.deploy(admin(svc), dag_text(plan), str(DEMO_DAG))
        changed = chain_changes(svc, plan)
        if changed:
            console.print(
                f"[yellow]{len(changed)} synced range{'s' if len(changed) > 1 else ''} no longer "
                "match the chain[/yellow] (a reorg, or a chain reset under the same id): "
                "re-syncing them and recomputing what was built from them"
            )
            for m in changed[:5]:
                console.print(f"  {m.describe()}", highlight=False)
        if not changed and complete(svc, plan):
            console.print(
                f"[green]Blocks {plan.from_block}-{plan.to_block} are already synced and analysed[/green]: reusing them."
            )
        else:
            console.print(
                f"[bold]Backfilling blocks {plan.from_block}-{plan.to_block}[/bold] from {plan.rpc_url} "
                f"in {plan.ranges} ranges of {plan.chunk_size}…"
            )
            with phases.phase("backfill: sync, decode, analytics"):
                tasks = backfill(svc, plan, console)
            if tasks is None:
                return 1
            phases.stages(tasks, stage_of(tasks))
        save_run(state_file, plan)
        with phases.phase("report: queries and charts"):
            analytics(svc, plan, settings.home / "demo", console)
            where(svc, plan, console)
        with phases.phase("alerts: delivered and verified"):
            settle(svc, admin(svc), receiver, console)
        svc.publisher.drain()
        dead = svc.driver.dead_letters(settings.task_queue)
        console.print(f"outbox pending: {svc.publisher.pending()}; dead letters: {len(dead)}")
    finally:
        if receiver is not None:
            receiver.stop()
        with phases.phase("stop the stack"):
            stack.stop()
    if devnet is not None:
        devnet.down()
    phases.report(console)
    console.print(f"[bold green]done[/bold green] in {time.monotonic() - phases.t0:.1f}s")
    return 0


def allow_also(url: str) -> str:
    """TRACE_EGRESS_ALLOW as this process has it, and `url`'s host:port."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return egress_allow(os.environ.get("TRACE_EGRESS_ALLOW", ""), f"{host}:{port}")


def _start_devnet(settings: Settings, console: Console, spec: Any) -> tuple[Any, str, str]:
    from trace_platform.devnet import Devnet

    devnet = Devnet(settings.home)
    with Progress(
        TextColumn("devnet: generating blocks"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("blocks", total=spec.blocks)
        info, chain = devnet.up(spec, lambda n: bar.update(task, completed=n))
        bar.update(task, completed=spec.blocks)
    console.print(f"devnet at {info.url}: token {chain.token}, staking {chain.staking}")
    return devnet, info.url, chain.token
