"""Query Service latency against bare DuckDB over the same files, in the same run.

Synthetic chain-shaped data (cold Parquet datasets committed like an operator's output, and a
hot window loaded into Postgres by the real sink code) sized by --blocks. Each query runs
interleaved five ways:

- bare: bare DuckDB (one warm connection, the same views over the same files and tables, the
  same SQL, no sandbox);
- in-proc: the sandboxed engine inside this process, on a pinned plan (what the Query Service
  did before queries moved out of the API process);
- worker: the same pinned plan run by the Query Service's worker process (pipe, limits, Arrow
  IPC both ways); worker - in-proc is the added cost of out-of-process execution;
- service: the whole Query Service call (guard + registry pin + worker);
- HTTP: the service over HTTP (plus auth and JSON).

Every path's result is checked against bare DuckDB's, on every run. Prints p50/p95, the
service/bare and HTTP/bare ratios, and the isolation cost (worker - in-proc, p50). Target: the
service within 1.25x of bare DuckDB on queries of 20 ms or more.

    python bench/query_bench.py [--blocks 200000] [--repeat 30]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extensions
import httpx
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.datasets import commit_parquet, load_hot

from trace_platform.config import Settings
from trace_platform.db.embedded import EmbeddedPostgres, free_port
from trace_platform.db.migrate import migrate
from trace_platform.identity import lite_admin
from trace_platform.lite.stack import ApiServer
from trace_platform.query import catalog, formats, guard, saved
from trace_platform.query.engine import PG_ALIAS, Engine, run, view_sql
from trace_platform.services import Services

TOKEN = "0x" + "ab" * 20
ZERO = "0x" + "00" * 20
DAG = """
name: bench
jobs:
  ingest: {operator: noop, outputs: [{}, {}]}
  hot:
    operator: hot_window
    inputs: [{job: ingest, output: 0}]
    outputs: [{backend: postgres}]
  analytics: {operator: noop, outputs: [{}, {}, {}, {}]}
publish:
  - {job: ingest, output_index: 0, dataset: blocks}
  - {job: ingest, output_index: 1, dataset: transactions}
  - {job: hot, output_index: 0, dataset: blocks_hot, hot_window: {of: blocks}}
  - {job: analytics, output_index: 0, dataset: token_supply}
  - {job: analytics, output_index: 1, dataset: token_balances}
  - {job: analytics, output_index: 2, dataset: validator_stake}
  - {job: analytics, output_index: 3, dataset: staking_concentration}
"""


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def make_data(svc: Services, blocks: int, hot: int) -> None:
    import numpy as np

    rng = np.random.default_rng(7)
    chunk = max(1, blocks // 4)
    dec = pa.decimal128(38, 0)
    for a in range(0, blocks, chunk):
        b = min(blocks, a + chunk)
        n = np.arange(a, b, dtype=np.int64)
        blk = pa.table(
            {
                "block_number": n,
                "gas_used": rng.integers(0, 30_000_000, len(n)),
                "timestamp": n * 1 + 1_750_000_000,
            }
        )
        commit_parquet(svc, "blocks", blk, a, b)
        tn = np.repeat(n, 5)
        tx = pa.table(
            {
                "block_number": tn,
                "transaction_index": np.tile(np.arange(5), len(n)),
                "from_address": pa.array([f"0x{i:040x}" for i in rng.integers(0, 5000, len(tn))]),
                "gas_used": rng.integers(21_000, 500_000, len(tn)),
            }
        )
        commit_parquet(svc, "transactions", tx, a, b)
        if b > blocks - hot:
            lo = max(a, blocks - hot)
            load_hot(svc, "blocks_hot", blk.slice(lo - a), a, b, window=hot)
    # Analytics outputs, shaped as the Spark jobs write them.
    mints = np.sort(rng.choice(blocks, size=min(blocks, 20_000), replace=False))
    delta = rng.integers(1, 10**6, len(mints)) * 10**12
    supply = pa.table(
        {
            "token_address": [TOKEN] * len(mints),
            "block_number": mints,
            "supply_delta": pa.array([int(x) for x in delta], dec),
            "total_supply": pa.array([int(x) for x in np.cumsum(delta)], dec),
        }
    )
    commit_parquet(svc, "token_supply", supply, 0, blocks)
    accounts, changes = 1000, max(1, blocks // 400)
    acct = np.repeat(np.arange(accounts), changes)
    blk = np.sort(rng.integers(0, blocks, (accounts, changes)), axis=1).ravel()
    bal = np.cumsum(rng.integers(1, 10**6, (accounts, changes)), axis=1).ravel() * 10**12
    balances = pa.table(
        {
            "token_address": [TOKEN] * len(acct),
            "account": [f"0x{i:040x}" for i in acct],
            "block_number": blk,
            "delta": pa.array([0] * len(acct), dec),
            "balance": pa.array([int(x) for x in bal], dec),
        }
    )
    commit_parquet(svc, "token_balances", balances, 0, blocks)
    windows, validators = max(1, blocks // 100), 100
    we = np.repeat(np.arange(windows) * 100 + 99, validators)
    stake = rng.integers(1, 10**6, windows * validators) * 10**15
    share = stake / np.repeat(stake.reshape(windows, validators).sum(axis=1), validators)
    commit_parquet(
        svc,
        "validator_stake",
        pa.table(
            {
                "window_end": we,
                "validator_id": np.tile(np.arange(1, validators + 1), windows),
                "stake": pa.array([int(x) for x in stake], dec),
                "share": share,
                "stake_rank": np.tile(np.arange(1, validators + 1), windows),
            }
        ),
        0,
        blocks,
    )
    conc = pa.table(
        {
            "window_end": np.arange(windows) * 100 + 99,
            "validators": np.full(windows, validators),
            "total_stake": pa.array([10**20] * windows, dec),
            "hhi": rng.random(windows) / 10,
            "nakamoto_coefficient": np.full(windows, 20),
            "top_share": rng.random(windows) / 10,
        }
    )
    commit_parquet(svc, "staking_concentration", conc, 0, blocks)


def queries(blocks: int) -> list[tuple[str, str, dict[str, Any]]]:
    every = max(1, blocks // 200)

    def s(name: str, **p: Any) -> tuple[str, str, dict[str, Any]]:
        q = saved.load(name)
        return name, q.sql, q.params(p)

    return [
        s("token_supply", token=TOKEN, every=every),
        s("top_holders", token=TOKEN, n=10),
        s("holder_history", token=TOKEN, n=5, every=every),
        s("staking_concentration"),
        s("recent_blocks", n=10),
        (
            "hot+cold join",
            "SELECT count(*), sum(t.gas_used) FROM blocks_hot h JOIN transactions t USING (block_number)",
            {},
        ),
    ]


def bare_connection(svc: Services, me: Any, sqls: list[str]) -> duckdb.DuckDBPyConnection:
    """Plain DuckDB with the same views over the same files and tables (no guard, no pinning,
    no sandbox)."""
    names: set[str] = set()
    for sql in sqls:
        names |= guard.dataset_names(sql)
    pins = catalog.pin(svc.pool, svc.query.store, me, names)
    con = duckdb.connect()
    duckdb_extensions.import_extension("postgres_scanner", con=con)
    con.execute("LOAD postgres_scanner")
    con.execute(f"ATTACH '{svc.dsn}' AS {PG_ALIAS} (TYPE postgres, READ_ONLY)")
    con.execute("SET threads = 2")
    for p in pins.values():
        con.execute(f'CREATE VIEW "{p.name}" AS {view_sql(p)}')
    return con


def same(got: pa.Table, want: pa.Table, what: str) -> None:
    """The same rows (in order when they are equal in order; else as a multiset)."""
    a, b = formats.rows(got), formats.rows(want)
    if a != b and sorted(map(repr, a)) != sorted(map(repr, b)):
        raise AssertionError(f"{what}: result differs from bare DuckDB's")


def main() -> None:
    os.environ["TRACE_OPERATOR_REGISTRY"] = "testing"  # the no-op test operators
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=200_000)
    ap.add_argument("--hot", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trace-qbench-", dir="/tmp"))
    root.chmod(0o755)
    pg = EmbeddedPostgres(root / "pg", durable=True)
    pg.start()
    try:
        dsn = pg.dsn()
        migrate(dsn)
        settings = Settings(state_dsn=dsn, home=root / "home", auth="permissive")
        svc = Services.build(settings, dsn)
        with svc.pool.connection() as conn:
            me = lite_admin(conn)
        svc.control.deploy(me, DAG)
        t0 = time.perf_counter()
        make_data(svc, args.blocks, args.hot)
        print(
            f"machine: {os.cpu_count()} cores; {args.blocks:,} blocks, {args.blocks * 5:,} txs, "
            f"hot window {args.hot:,} blocks in Postgres; data built in {time.perf_counter() - t0:.1f}s"
        )
        server = ApiServer(svc, "127.0.0.1", free_port(), background=False)
        server.start()
        http = httpx.Client(base_url=server.url, timeout=60)
        qs = queries(args.blocks)
        bare = bare_connection(svc, me, [sql for _, sql, _ in qs])
        inproc = Engine(svc.query.pg_dsn, svc.query.s3)
        limits = svc.query.limits
        print(
            f"\n{'query':<22} {'rows':>6} {'bare p50/p95 ms':>16} {'in-proc p50':>11} "
            f"{'worker p50':>10} {'isolation':>9} {'service p50/p95':>16} {'ratio':>6} "
            f"{'HTTP p50/p95':>15} {'ratio':>6}"
        )
        ratios: list[tuple[str, float, float]] = []
        rng = random.Random(7)
        for name, sql, params in qs:
            t: dict[str, list[float]] = {k: [] for k in ("bare", "inproc", "worker", "svc", "http")}
            plan = svc.query.plan(me, sql, params)
            want = bare.execute(sql, params or None).to_arrow_table()  # the reference
            rows = want.num_rows
            expected = json.loads(json.dumps(formats.rows(want)))

            for i in range(args.repeat + 3):
                order = list(t)
                rng.shuffle(order)  # no path always runs first (or right after another)
                for k in order:
                    body: dict[str, Any] = {}
                    t0 = time.perf_counter()
                    if k == "bare":
                        got = bare.execute(sql, params or None).to_arrow_table()
                    elif k == "inproc":
                        with inproc.cursor(plan.pins, limits) as cur:
                            got = run(cur, sql, params, limits)
                    elif k == "worker":
                        got = svc.query.execute(plan).table
                    elif k == "svc":
                        got = svc.query.query(me, sql, params).table
                    else:
                        r = http.post("/v1/query", json={"sql": sql, "params": params})
                        assert r.status_code == 200, r.text
                        body = r.json()
                    took = (time.perf_counter() - t0) * 1000
                    if k == "http":  # every run of every path is checked
                        assert body["row_count"] == rows, f"{name} HTTP: {body['row_count']} rows"
                        if body["rows"] != expected:
                            assert sorted(map(repr, body["rows"])) == sorted(map(repr, expected)), (
                                f"{name} HTTP: result differs from bare DuckDB's"
                            )
                    else:
                        same(got, want, f"{name} {k}")
                    if i >= 3:  # warm-up excluded
                        t[k].append(took)
            p50 = {k: pct(v, 50) for k, v in t.items()}
            ratios.append((name, p50["bare"], p50["svc"] / p50["bare"]))
            print(
                f"{name:<22} {rows:>6} {p50['bare']:>7.2f} / {pct(t['bare'], 95):>6.2f} "
                f"{p50['inproc']:>11.2f} {p50['worker']:>10.2f} "
                f"{p50['worker'] - p50['inproc']:>+8.2f} "
                f"{p50['svc']:>7.2f} / {pct(t['svc'], 95):>6.2f} {p50['svc'] / p50['bare']:>5.2f}x "
                f"{p50['http']:>6.2f} / {pct(t['http'], 95):>6.2f} {p50['http'] / p50['bare']:>5.2f}x"
            )
        inproc.close()
        big = [(n, r) for n, b, r in ratios if b >= 20]
        worst = max((r for _, r in big), default=None)
        print(
            f"\nservice/bare on the {len(big)} queries of 20 ms or more (bare p50): "
            + (
                f"worst {worst:.2f}x ({'within' if worst <= 1.25 else 'OVER'} the 1.25x target)"
                if worst is not None
                else "none this size at --blocks " + f"{args.blocks:,}"
            )
        )
        pids = svc.query.workers.pids()
        print(
            f"query workers: {len(pids['idle']) + len(pids['busy'])} live, "
            f"{svc.query.workers.started} started, {svc.query.workers.replaced} replaced"
        )
        server.stop()
        svc.close()
    finally:
        pg.destroy()


if __name__ == "__main__":
    main()
