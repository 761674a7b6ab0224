"""Full raw sync of a devnet through Trace against bare Cryo on the same range, same run.

1. Bare Cryo: `cryo.freeze` of blocks, transactions, logs and geth_calls for the whole range
   (chunk 1000, same requests/s and concurrency as the DAG uses).
2. Trace: the `monad_sync` example DAG (range_splitter -> cryo_ingest, 2 worker processes,
   pool of 2 slots) from the trigger to the last range committed in the object store.
3. Spark decode throughput: decode_erc20_transfers' transformation over all synced logs
   (rows/s), in one warm SparkSession.

Run: `.venv/bin/python bench/sync_bench.py [--blocks 10000]`. Prints blocks/s and the
orchestration overhead of Trace over bare Cryo (target <= 15%).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from trace_platform.config import Settings
from trace_platform.db.embedded import EmbeddedPostgres
from trace_platform.db.migrate import migrate
from trace_platform.devnet import ChainSpec, Devnet
from trace_platform.identity import lite_admin
from trace_platform.lite.stack import LiteStack
from trace_platform.objectstore import list_all, make_store

ROOT = Path(__file__).resolve().parents[1]
RPS, CONCURRENCY, CHUNK = 200, 4, 1000
DATATYPES = ("blocks", "transactions", "logs", "geth_calls")


def bare_cryo(url: str, blocks: int, out: Path) -> float:
    import cryo

    t0 = time.perf_counter()
    for datatype in DATATYPES:  # one after another, as cryo_ingest does
        cryo.freeze(
            [datatype],
            blocks=[f"0:{blocks}"],
            rpc=url,
            output_dir=str(out),
            network_name="devnet",
            # The same per-call budget as each cryo_ingest task. (Doubling it to match the DAG's
            # two parallel ranges made anvil fail debug_traceBlockByNumber calls here.)
            requests_per_second=RPS,
            max_concurrent_requests=CONCURRENCY,
            chunk_size=CHUNK,
            no_verbose=True,
        )
    elapsed = time.perf_counter() - t0
    made = {d: len(list(out.glob(f"*__{d}__*.parquet"))) for d in DATATYPES}
    expected = -(-blocks // CHUNK)
    if any(n != expected for n in made.values()):  # Cryo does not raise on failed chunks
        raise SystemExit(f"bare Cryo lost chunks: {made} (expected {expected} each); rerun")
    return elapsed


def trace_sync(stack: LiteStack, url: str, blocks: int) -> float:
    svc = stack.services
    with svc.pool.connection() as conn:
        admin = lite_admin(conn)
    text = (
        (ROOT / "examples" / "dags" / "monad_sync.yaml")
        .read_text()
        .replace("http://127.0.0.1:8545", url)
    )
    svc.control.deploy(admin, text)
    t0 = time.perf_counter()
    run_id = svc.control.trigger(
        admin, "monad_sync", config={"from_block": 0, "to_block": blocks - 1, "chunk_size": CHUNK}
    )["run_id"]
    while True:
        tasks = svc.control.show_run(admin, run_id)["tasks"]
        if tasks and all(t["status"] in ("succeeded", "failed") for t in tasks) and len(tasks) > 1:
            break
        time.sleep(0.05)
    elapsed = time.perf_counter() - t0
    failed = [t["last_error"] for t in tasks if t["status"] != "succeeded"]
    if failed:
        raise SystemExit(f"sync failed: {failed[:2]}")
    return elapsed


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
    return n, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=10_000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trace-sync-bench-", dir="/tmp"))
    work.chmod(0o755)
    devnet = Devnet(work / "home")
    pg = EmbeddedPostgres(work / "pg", durable=True)
    try:
        t0 = time.perf_counter()
        info, _ = devnet.up(ChainSpec(blocks=args.blocks, accounts=300, validators=10))
        print(
            f"devnet: {args.blocks} blocks generated in {time.perf_counter() - t0:.0f} s (not measured below)"
        )
        bare = bare_cryo(info.url, args.blocks, work / "bare")
        print(f"bare Cryo:            {args.blocks / bare:8.0f} blocks/s  ({bare:.1f} s)")
        pg.start()
        dsn = pg.dsn()
        migrate(dsn)
        settings = Settings(
            state_dsn=dsn, home=work / "home", auth="permissive", queue_poll_seconds=0.5
        )
        with LiteStack(settings, workers=2, dsn=dsn) as stack:
            traced = trace_sync(stack, info.url, args.blocks)
            print(f"Trace (DAG, 2 workers): {args.blocks / traced:6.0f} blocks/s  ({traced:.1f} s)")
            print(f"orchestration overhead: {100 * (traced / bare - 1):+.1f}% (target <= 15%)")
            rows, secs = decode_throughput(stack, settings, work)
            print(
                f"Spark decode (transfers from {rows} log rows): {rows / secs:8.0f} rows/s ({secs:.2f} s)"
            )
    finally:
        devnet.down()
        pg.destroy()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
