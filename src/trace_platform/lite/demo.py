"""`trace demo` / `make demo`: the Monad demo end to end on the Lite stack.

Starts the embedded Postgres, the local object store, the devnet (or uses `--rpc-url`) and the
Lite stack; deploys `examples/dags/monad_demo.yaml`; backfills the range with progress bars;
then prints the three analytics through the Query Service, writes PNG charts, and says where
everything is. A second run over the same range finds the data complete and only queries."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from trace_platform.config import Settings
from trace_platform.contract import TERMINAL
from trace_platform.db.queries import Queries
from trace_platform.identity import Actor, lite_admin
from trace_platform.lite.stack import LiteStack
from trace_platform.query import saved
from trace_platform.services import Services

_Q = Queries("demo")
DEMO_DAG = Path(__file__).resolve().parents[3] / "examples" / "dags" / "monad_demo.yaml"
RAW = ("blocks", "transactions", "logs", "traces")
ANALYTICS = ("token_supply", "token_balances", "validator_stake", "staking_concentration")
STAGES = [
    ("ingest", "Cryo sync (blocks, txs, logs, traces)"),
    ("hot", "hot window → Postgres"),
    ("transfers", "decode ERC20 transfers (Spark)"),
    ("staking", "decode staking events (Spark)"),
    ("analytics", "analytics (Spark SQL)"),
]


@dataclass
class DemoPlan:
    rpc_url: str
    token: str
    from_block: int
    to_block: int
    chunk_size: int
    network: str
    window_blocks: int  # staking concentration windows
    hot_blocks: int

    @property
    def ranges(self) -> int:
        from trace_platform.operators.ranges import split

        return len(split(self.from_block, self.to_block, self.chunk_size))


def dag_text(plan: DemoPlan) -> str:
    """The demo DAG with this plan's chain, range and window sizes set by key."""
    import yaml

    dag = yaml.safe_load(DEMO_DAG.read_text())
    for slot in dag["worker_pools"]["rpc"]:
        slot["env"]["RPC_URL"] = plan.rpc_url
    jobs = dag["jobs"]
    jobs["ingest"]["config"]["network_name"] = plan.network
    jobs["hot"]["config"]["window_blocks"] = plan.hot_blocks
    jobs["validator_stake"]["config"]["args"]["window_blocks"] = plan.window_blocks
    for name in ("transfers_complete", "staking_complete"):
        # The analytics run once the whole backfill is in: one aggregation window = the range.
        jobs[name]["config"] = {
            "size": plan.to_block - plan.from_block + 1,
            "origin": plan.from_block,
        }
    return str(yaml.safe_dump(dag, sort_keys=False))


def _admin(svc: Services) -> Actor:
    with svc.pool.connection() as conn:
        return lite_admin(conn)


def complete(svc: Services, plan: DemoPlan) -> bool:
    """The current versions already hold the whole range and the analytics over it."""
    found = coverage(svc, RAW + ANALYTICS)
    with svc.pool.connection() as conn:
        busy = conn.execute(_Q.unfinished_tasks, {"dag": "monad_demo"}).fetchone()
    if busy and busy["n"]:
        return False
    for name in RAW:
        r = found.get(name)
        if r is None or r["commits"] != plan.ranges:
            return False
        if r["lo"] != plan.from_block or r["hi"] != plan.to_block + 1:
            return False
    return all(found.get(n) and found[n]["commits"] for n in ANALYTICS)


def backfill(svc: Services, plan: DemoPlan, console: Console) -> bool:
    me = _admin(svc)
    run = svc.control.trigger(
        me,
        "monad_demo",
        config={
            "from_block": plan.from_block,
            "to_block": plan.to_block,
            "chunk_size": plan.chunk_size,
        },
    )
    run_id = run["run_id"]
    columns = (
        TextColumn("{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    totals = {
        "ingest": plan.ranges,
        "hot": 4 * plan.ranges,
        "transfers": plan.ranges,
        "staking": plan.ranges,
    }
    with Progress(*columns, console=console, refresh_per_second=4) as progress:
        bars = {
            job: progress.add_task(what, total=totals.get(job), info="") for job, what in STAGES
        }
        while True:
            tasks = svc.control.show_run(me, run_id)["tasks"]
            by_job: dict[str, list[dict[str, Any]]] = {}
            for t in tasks:
                if t["job"] == "backfill" or t["job"].endswith("_complete"):
                    continue  # the splitter and the aggregators: bookkeeping, not stages
                job = t["job"] if t["job"] in totals else "analytics"
                by_job.setdefault(job, []).append(t)
            rows = {n: int(r["row_count"]) for n, r in coverage(svc, RAW).items()}
            for job, bar in bars.items():
                mine = by_job.get(job, [])
                done = sum(t["status"] in TERMINAL for t in mine)
                failed = sum(t["status"] == "failed" for t in mine)
                info = f"[red]{failed} failed[/red]" if failed else ""
                if job == "ingest":
                    info = f"{rows.get('blocks', 0):,} blocks, {rows.get('transactions', 0):,} txs, {rows.get('logs', 0):,} logs {info}"
                total = totals.get(job) or max(len(mine), 1)
                progress.update(bar, completed=done, total=total, info=info)
            if tasks and all(t["status"] in TERMINAL for t in tasks) and len(tasks) > 1:
                # Downstream tasks are created with their upstream's completion, so when all
                # are terminal the run is over.
                break
            time.sleep(0.5)
    failed = [t for t in tasks if t["status"] != "succeeded"]
    for t in failed:
        console.print(f"[red]{t['job']} failed:[/red] {t['last_error']}")
    console.print(
        f"run {run_id}: {len(tasks)} tasks (see it: [cyan]trace runs show {run_id}[/cyan])"
    )
    return not failed


def coverage(svc: Services, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    with svc.pool.connection() as conn:
        rows = conn.execute(_Q.current_coverage, {"names": list(names)}).fetchall()
    return {r["dataset_name"]: r for r in rows}


def saved_rows(svc: Services, me: Actor, name: str, **params: Any) -> list[dict[str, Any]]:
    q = saved.load(name)
    out = svc.query.query(me, q.sql, q.params(params)).as_json()
    cols = [c["name"] for c in out["columns"]]
    return [dict(zip(cols, r, strict=True)) for r in out["rows"]]


AMOUNTS = {"total_supply", "balance", "stake", "total_stake"}  # base units, 18 decimals


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column in AMOUNTS or column.startswith("0x"):
        return f"{int(value) / 10**18:,.2f}"  # display only; the data stays exact
    return str(value)


def _table(title: str, rows: list[dict[str, Any]], limit: int = 12) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold")
    if not rows:
        table.add_column("(no rows)")
        return table
    for c in rows[0]:
        table.add_column(c, justify="left" if c == "account" else "right")
    step = max(1, len(rows) // limit)
    shown = rows[::step][:limit]
    if rows[-1] is not shown[-1]:
        shown.append(rows[-1])
    for r in shown:
        table.add_row(*[_cell(c, v) for c, v in r.items()])
    if len(shown) < len(rows):
        table.caption = f"{len(shown)} of {len(rows)} rows (evenly sampled)"
    return table


def analytics(svc: Services, plan: DemoPlan, out_dir: Path, console: Console) -> None:
    from trace_platform.lite.charts import holders_chart, supply_chart

    me = _admin(svc)
    every = max(1, (plan.to_block - plan.from_block + 1) // 200)
    supply = saved_rows(svc, me, "token_supply", token=plan.token, every=every)
    console.print(
        f"\n[bold]Analytics[/bold] for token {plan.token}, blocks {plan.from_block}-{plan.to_block} "
        "[dim](amounts in tokens: base units ÷ 10^18; the datasets hold exact integers)[/dim]"
    )
    console.print(_table("(1) Total supply by block", supply))
    top = saved_rows(svc, me, "top_holders", token=plan.token, n=10)
    console.print(_table(f"(2) Top 10 holders at block {plan.to_block}", top, limit=10))
    history = saved_rows(svc, me, "holder_history", token=plan.token, n=5, every=every)
    accounts = sorted({r["account"] for r in history})
    pivot: dict[int, dict[str, Any]] = {}
    for r in history:
        pivot.setdefault(r["block_number"], {"block_number": r["block_number"]})[
            r["account"][:10] + "…"
        ] = r["balance"]
    console.print(
        _table(f"    …and the historic balances of the top {len(accounts)}", list(pivot.values()))
    )
    stake = saved_rows(svc, me, "validator_stake")
    console.print(_table("(3) Stake per validator (last window)", stake, limit=20))
    conc = saved_rows(svc, me, "staking_concentration")
    console.print(_table("    Staking concentration per window", conc))
    out_dir.mkdir(parents=True, exist_ok=True)
    charts = [
        supply_chart(supply, out_dir / "supply_by_block.png", plan.token),
        holders_chart(history, out_dir / "top_holder_balances.png", plan.token),
    ]
    for c in charts:
        console.print(f"chart: [cyan]{c}[/cyan]")


def where(svc: Services, plan: DemoPlan, console: Console) -> None:
    me = _admin(svc)
    table = Table("dataset", "backend", "rows", "where", title="Outputs", title_justify="left")
    table.columns[3].overflow = "fold"
    root = Path(svc.settings.object_store_root or "").resolve()
    for d in svc.control.list_datasets(me):
        rows = int(d["row_count"] or 0)
        if d["backend"] == "parquet":
            loc = f"{root}/{d['location']}version/{d['current_version']}/"
        else:
            loc = f"Postgres {d['location']}.v_{d['current_version'].hex} (view published.{d['dataset_name']})"
            if d["commits"]:  # a window: what it holds now, not what passed through it
                rows = (
                    svc.query.query(me, f"SELECT count(*) FROM {d['dataset_name']}")
                    .table[0][0]
                    .as_py()
                )
        table.add_row(d["dataset_name"], d["backend"], f"{rows:,}", loc)
    console.print(table)
    console.print(
        "Query them (each name pinned to its current version):\n"
        '  [cyan]trace query "SELECT count(*), max(block_number) FROM blocks"[/cyan]\n'
        f"  [cyan]trace query --saved top_holders --param token={plan.token}[/cyan]\n"
        "  [cyan]trace query --list[/cyan]   (saved queries)    "
        "[cyan]trace datasets list[/cyan]"
    )


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
) -> int:
    console = console or Console()
    if not console.is_terminal:  # logs and CI: wide enough for the tables
        console.width = max(console.width, 160)
    t0 = time.monotonic()
    state_file = settings.home / "demo" / "last.json"
    devnet = None
    previous = json.loads(state_file.read_text()) if state_file.exists() else None
    if rpc_url is None:
        plan = _devnet_plan(settings, from_block, to_block, chunk_size or 500, state_file)
    else:
        if token is None or from_block is None or to_block is None:
            console.print("[red]error:[/red] --rpc-url needs --token, --from-block and --to-block")
            return 2
        plan = _chain_plan(rpc_url, token, from_block, to_block, chunk_size or 500)
    if previous and previous.get("network") == plan.network:
        # Same chain, same dataset versions: other range boundaries would add overlapping
        # range commits (rows twice), so keep the boundaries the data was synced with.
        if chunk_size is None:
            plan.chunk_size = int(previous["chunk_size"])
        elif chunk_size != previous["chunk_size"]:
            console.print(
                f"[red]error:[/red] this chain was synced in ranges of {previous['chunk_size']}; "
                f"ranges of {chunk_size} would overlap them in the same dataset versions. Use "
                f"--chunk-size {previous['chunk_size']}, or another TRACE_HOME."
            )
            return 2
    console.print(
        "[bold]Starting Trace Lite[/bold] (embedded Postgres, object store, API, workers)…"
    )
    with LiteStack(settings, workers=workers) as stack:
        svc = stack.services
        console.print(f"API at {stack.url}; objects under {settings.object_store_root}")
        svc.control.deploy(_admin(svc), dag_text(plan), str(DEMO_DAG))
        if complete(svc, plan):
            console.print(
                f"[green]Blocks {plan.from_block}-{plan.to_block} are already synced and analysed[/green]: reusing them."
            )
        else:
            if rpc_url is None:
                devnet, plan.rpc_url, plan.token = _start_devnet(settings, console)
                # 8545 may have been taken: point the pool at the node's real URL (pool env is
                # not materialization, so the dataset versions stay).
                svc.control.deploy(_admin(svc), dag_text(plan), str(DEMO_DAG))
            console.print(
                f"[bold]Backfilling blocks {plan.from_block}-{plan.to_block}[/bold] from {plan.rpc_url} "
                f"in {plan.ranges} ranges of {plan.chunk_size}…"
            )
            if not backfill(svc, plan, console):
                return 1
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps(asdict(plan), indent=2))
        analytics(svc, plan, settings.home / "demo", console)
        where(svc, plan, console)
        svc.publisher.drain()
        dead = svc.driver.dead_letters(settings.task_queue)
        console.print(f"outbox pending: {svc.publisher.pending()}; dead letters: {len(dead)}")
    if devnet is not None:
        devnet.down()
    console.print(f"[bold green]done[/bold green] in {time.monotonic() - t0:.1f}s")
    return 0


def _devnet_plan(
    settings: Settings, a: int | None, b: int | None, chunk: int, state_file: Path
) -> DemoPlan:
    from trace_platform.devnet import ChainSpec

    spec = ChainSpec()
    token = "0x5fbdb2315678afecb367f032d93f642f64180aa3"  # the devnet's first deployment
    if state_file.exists():
        token = json.loads(state_file.read_text()).get("token", token)
    return DemoPlan(
        rpc_url="http://127.0.0.1:8545",
        token=token,
        from_block=a if a is not None else 0,
        to_block=b if b is not None else spec.blocks - 1,
        chunk_size=chunk,
        network="devnet",
        window_blocks=spec.epoch_blocks,
        hot_blocks=500,
    )


def _chain_plan(url: str, token: str, a: int, b: int, chunk: int) -> DemoPlan:
    from trace_platform.chain import Rpc

    rpc = Rpc(url)
    try:
        chain_id = int(rpc.call("eth_chainId"), 16)
    finally:
        rpc.close()
    span = b - a + 1
    return DemoPlan(
        rpc_url=url,
        token=token.lower(),
        from_block=a,
        to_block=b,
        chunk_size=chunk,
        network=f"chain{chain_id}",
        window_blocks=max(10, span // 20),
        hot_blocks=min(10_000, max(100, span // 4)),
    )


def _start_devnet(settings: Settings, console: Console) -> tuple[Any, str, str]:
    from trace_platform.devnet import ChainSpec, Devnet

    devnet = Devnet(settings.home)
    spec = ChainSpec()
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
