"""Full raw sync of a devnet through Trace against bare Cryo on the same ranges, same run, each
side given the same RPC budget:

1. One range at a time: bare Cryo freezes the ranges one after another (blocks, transactions,
   logs, geth_calls; 200 requests/s and 4 concurrent requests per call); Trace runs the
   `monad_sync` DAG with one worker and a pool of one slot, so one `cryo_ingest` (same budget)
   at a time.
2. Two at a time: bare Cryo freezes two ranges at once (two calls, each that budget); Trace
   runs two workers and a pool of two slots.

Each side is checked complete before its figure prints: every range of every datatype present,
and Trace's committed rows equal to bare Cryo's rows, datatype by datatype.
3. Spark decode throughput: decode_erc20_transfers' transformation over all synced logs
   (rows/s), in one warm SparkSession; its output row count checked against the logs.

Trace's time runs from the trigger to the run's last task ending (its last commit), once its
workers wait on the queue (a worker's own boot is a service's start, not the sync's; the
operator host each worker starts for the DAG's first task is measured). A line after each
figure says where Trace's time went (from the run's task timestamps).

Run: `.venv/bin/python bench/sync_bench.py [--blocks 10000] [--repeat 3]`. Prints blocks/s and
the orchestration overhead of Trace over bare Cryo at each concurrency (target <= 15%). On a
shared machine use `--repeat`: bare/Trace pairs interleaved (alternating which side goes first)
and the median ratio, as the node's speed drifts with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

import smoke  # this folder's: run as a script
from trace_platform.config import Settings
from trace_platform.db.embedded import EmbeddedPostgres
from trace_platform.db.migrate import migrate
from trace_platform.devnet import ChainSpec, Devnet
from trace_platform.identity import lite_admin
from trace_platform.lite.stack import LiteStack, egress_allow
from trace_platform.objectstore import list_all, make_store

ROOT = Path(__file__).resolve().parents[1]
RPS, CONCURRENCY, CHUNK = 200, 4, 1000
DATATYPES = ("blocks", "transactions", "logs", "geth_calls")


def freeze_range(url: str, start: int, end: int, out: Path) -> None:
    """One range, every datatype one after another, as one cryo_ingest task does."""
    import cryo

    for datatype in DATATYPES:
        cryo.freeze(
            [datatype],
            blocks=[f"{start}:{end}"],
            rpc=url,
            output_dir=str(out),
            network_name="devnet",
            requests_per_second=RPS,  # the per-call budget of each cryo_ingest task
            max_concurrent_requests=CONCURRENCY,
            chunk_size=CHUNK,
            no_verbose=True,
        )


def bare_cryo(url: str, blocks: int, out: Path, parallel: int) -> tuple[float, dict[str, int]]:
    """The ranges frozen `parallel` at a time; (seconds, rows per datatype)."""
    import polars as pl

    ranges = [(a, min(a + CHUNK, blocks)) for a in range(0, blocks, CHUNK)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda r: freeze_range(url, r[0], r[1], out), ranges))
    elapsed = time.perf_counter() - t0
    made = {d: len(list(out.glob(f"*__{d}__*.parquet"))) for d in DATATYPES}
    if any(n != len(ranges) for n in made.values()):  # Cryo does not raise on failed chunks
        raise SystemExit(f"bare Cryo lost chunks: {made} (expected {len(ranges)} each); rerun")
    rows = {
        d: sum(pl.scan_parquet(f).select(pl.len()).collect().item() for f in out.glob(f"*__{d}__*"))
        for d in DATATYPES
    }
    return elapsed, rows


def wait_for_workers(dsn: str, n: int, timeout: float = 120.0) -> None:
    """Until `n` worker loops wait on the queue (each holds a LISTEN connection once idle):
    worker processes are long-lived services, so their boot (interpreter, imports, pools) is
    not part of a sync; timing from a trigger sent while they still boot charged Trace for it.
    The operator host's start (sandbox, interpreter) is per task tenant and stays measured."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query = 'LISTEN trace_queue'"
            ).fetchone()
            if row is not None and row[0] >= n:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"{n} worker(s) not waiting on the queue after {timeout:.0f} s")
            time.sleep(0.05)


def breakdown(run: dict[str, Any], elapsed: float, slots: int) -> str:
    """Where Trace's time went, from the run's task timestamps (database clock; the trigger's
    fire is time 0): until the first ingest claim, the ingest tasks' own run time per slot,
    slot time without an ingest running from the first claim to the last end (hand-offs,
    and a slot left with no range), and the tail to the bench seeing the run done."""
    t0 = run["created_at"]
    ingests = [t for t in run["tasks"] if t["operator"] == "cryo_ingest"]
    first = min(t["started_at"] for t in ingests)
    last = max(t["finished_at"] for t in ingests)
    ran = sum((t["finished_at"] - t["started_at"]).total_seconds() for t in ingests) / slots
    span = (last - first).total_seconds()
    head = (first - t0).total_seconds()
    return (
        f"trigger -> first ingest claimed {head:.1f} s; ingest tasks running {ran:.1f} s per "
        f"slot; slots idle in between {span - ran:.1f} s per slot; after the last ingest "
        f"{elapsed - head - span:.1f} s"
    )


def trace_sync(stack: LiteStack, url: str, blocks: int, slots: int) -> tuple[float, str]:
    svc = stack.services
    with svc.pool.connection() as conn:
        admin = lite_admin(conn)
    slot = f'    - env: {{RPC_URL: "{url}"}}\n'
    text = (
        (ROOT / "examples" / "dags" / "monad_sync.yaml")
        .read_text()
        .replace(2 * '    - env: {RPC_URL: "http://127.0.0.1:8545"}\n', slots * slot)
        .replace("max_concurrency: 2", f"max_concurrency: {slots}")
    )
    assert text.count(url) == slots, "the DAG's pool did not take the slots"
    svc.control.deploy(admin, text)
    wait_for_workers(svc.dsn, slots)
    t0 = time.perf_counter()
    run_id = svc.control.trigger(
        admin, "monad_sync", config={"from_block": 0, "to_block": blocks - 1, "chunk_size": CHUNK}
    )["run_id"]
    while True:
        run = svc.control.show_run(admin, run_id)
        tasks = run["tasks"]
        if tasks and all(t["status"] in ("succeeded", "failed") for t in tasks) and len(tasks) > 1:
            break
        time.sleep(0.05)
    elapsed = time.perf_counter() - t0
    failed = [t["last_error"] for t in tasks if t["status"] != "succeeded"]
    if failed:
        raise SystemExit(f"sync failed: {failed[:2]}")
    return elapsed, breakdown(run, elapsed, slots)


def committed_rows(stack: LiteStack) -> dict[str, int]:
    """Rows per datatype the Trace sync committed (its current versions)."""
    svc = stack.services
    with svc.pool.connection() as conn:
        admin = lite_admin(conn)
    names = {"blocks": "blocks", "transactions": "transactions", "logs": "logs"}
    names["geth_calls"] = "traces"
    return {d: int(svc.control.show_dataset(admin, n)["row_count"]) for d, n in names.items()}


def decode_throughput(stack: LiteStack, settings: Settings, work: Path) -> tuple[int, float]:
    from trace_platform.operators.decode import transfers_frame
    from trace_platform.spark import get_spark

    svc = stack.services
    with svc.pool.connection() as conn:
        admin = lite_admin(conn)
    ds = svc.control.show_dataset(admin, "logs")
    store = make_store(settings)
    local = work / "logs"
    local.mkdir()
    for o in list_all(
        store, f"org/{admin.org_id}/dataset/{ds['dataset_uuid']}/version/{ds['current_version']}/"
    ):
        store.get_file(o.key, local / o.key.replace("/", "_"))
    spark = get_spark()
    logs = spark.read.parquet(str(local)).cache()
    n = logs.count()
    t0 = time.perf_counter()
    out = transfers_frame(logs)
    out.write.mode("overwrite").parquet(str(work / "transfers"))
    took = time.perf_counter() - t0
    written = spark.read.parquet(str(work / "transfers")).count()
    expected = transfers_frame(logs).count()
    if written != expected or written == 0:
        raise SystemExit(f"refusing to print: decode wrote {written} rows, expected {expected}")
    return n, took


def trace_side(
    pg: EmbeddedPostgres, url: str, blocks: int, n: int, home: Path, db: str, decode: bool
) -> tuple[float, str, dict[str, int]]:
    """One Trace sync on a fresh database and home: (seconds, breakdown, committed rows);
    with `decode`, the Spark decode figure over what it synced follows the breakdown."""
    with psycopg.connect(pg.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    dsn = pg.dsn(db)
    migrate(dsn)
    settings = Settings(state_dsn=dsn, home=home, auth="permissive", queue_poll_seconds=0.5)
    with LiteStack(settings, workers=n, dsn=dsn) as stack:
        traced, where = trace_sync(stack, url, blocks, slots=n)
        got = committed_rows(stack)
        if decode:
            scratch = home.with_name(home.name + "-decode")  # not home: it has a logs/ dir
            scratch.mkdir()
            rows, secs = decode_throughput(stack, settings, scratch)
            where += (
                f"\nSpark decode (transfers from {rows} log rows, checked): "
                f"{rows / secs:8.0f} rows/s ({secs:.2f} s)"
            )
    return traced, where, got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=10_000)
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="bare/Trace pairs per concurrency, interleaved (the first side alternates), so a "
        "busy machine's drift falls on both sides; the median ratio is reported",
    )
    ap.add_argument(
        "--concurrency",
        default="1,2",
        help="ranges at a time, one figure each (the Spark decode follows the last)",
    )
    ap.add_argument("--accounts", type=int, default=300, help="the devnet's funded accounts")
    # Smoke size: a devnet of one short range (its generation is most of a smoke run).
    args = smoke.parse_args(ap, blocks=100, accounts=30, concurrency="1")
    concurrency = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="trace-sync-bench-", dir="/tmp"))
    work.chmod(0o755)
    devnet = Devnet(work / "home")
    pg = EmbeddedPostgres(work / "pg", durable=smoke.durable())
    try:
        t0 = time.perf_counter()
        info, _ = devnet.up(ChainSpec(blocks=args.blocks, accounts=args.accounts, validators=10))
        # The stacks' workers may reach this devnet (another home's: not their own `devnet`).
        os.environ["TRACE_EGRESS_ALLOW"] = egress_allow(
            os.environ.get("TRACE_EGRESS_ALLOW", ""), f"127.0.0.1:{info.port}"
        )
        print(
            f"devnet: {args.blocks} blocks generated in {time.perf_counter() - t0:.0f} s (not measured below)"
        )
        pg.start()
        print(
            f"each side: {RPS} requests/s and {CONCURRENCY} concurrent requests per Cryo call, "
            f"ranges of {CHUNK} blocks"
        )
        for n in concurrency:
            ratios = []
            for r in range(args.repeat):
                tag = f"{n}_{r}"
                last = n == concurrency[-1] and r == args.repeat - 1
                sides = ("bare", "trace") if r % 2 == 0 else ("trace", "bare")
                for side in sides:
                    if side == "bare":
                        bare, bare_rows = bare_cryo(info.url, args.blocks, work / f"bare{tag}", n)
                    else:
                        traced, where, got = trace_side(
                            pg, info.url, args.blocks, n, work / f"home{tag}", f"sync{tag}", last
                        )
                if got != bare_rows:
                    raise SystemExit(f"refusing to print: Trace committed {got}, Cryo {bare_rows}")
                ratios.append(traced / bare)
                print(
                    f"{n} range(s) at a time: bare Cryo {args.blocks / bare:6.0f} blocks/s "
                    f"({bare:.1f} s); Trace ({n} worker(s), {n} slot(s)) "
                    f"{args.blocks / traced:6.0f} blocks/s ({traced:.1f} s); overhead "
                    f"{100 * (traced / bare - 1):+.1f}% (target <= 15%); rows {got}"
                    + (f" [{' then '.join(sides)}]" if args.repeat > 1 else "")
                )
                print(f"  Trace's time: {where}")
            if args.repeat > 1:
                print(
                    f"{n} range(s) at a time, {args.repeat} interleaved pairs: median overhead "
                    f"{100 * (statistics.median(ratios) - 1):+.1f}% (each: "
                    + ", ".join(f"{100 * (x - 1):+.1f}%" for x in ratios)
                    + ")"
                )
    finally:
        devnet.down()
        pg.destroy()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    smoke.main(main)
