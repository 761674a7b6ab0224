"""Query Service latency against bare DuckDB over the same files, in the same run.

Every saved query (query/saved/*.sql), and a hot+cold join, over synthetic chain-shaped data
(cold Parquet datasets committed like an operator's output, and a hot window loaded into
Postgres by the real sink code) sized by --blocks. The datasets built are those the saved
queries read, each with the columns and types its declaration gives: the analytics' from the
platform DAG's SQL (lite/dags/monad_demo.yaml, followed from the decode operators' schemas;
amounts as limbs), so a column added there is built here too (with values of its type when
the bench has no shape for it). Every row built is counted back through bare DuckDB. Each
query runs interleaved five ways:

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

    python bench/query_bench.py [--blocks 200000] [--repeat 30] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extensions
import httpx
import pyarrow as pa
import sqlglot
import yaml
from sqlglot import exp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.amounts import ARROW_LIMBS, limbs
from tests.support.datasets import commit_parquet, load_hot

import smoke  # this folder's: run as a script
from embedded_pg import migrated_postgres  # this folder's: run as a script
from trace_platform.config import Settings
from trace_platform.db.embedded import free_port
from trace_platform.identity import lite_admin
from trace_platform.lite.stack import ApiServer
from trace_platform.operators.decode import STAKING_SCHEMA, TRANSFERS_SCHEMA
from trace_platform.query import bignum, catalog, formats, guard, saved
from trace_platform.query.engine import PG_ALIAS, Engine, _source, run, view_sql
from trace_platform.services import Services

TOKEN = "0x" + "ab" * 20
ZERO = "0x" + "00" * 20
# The DAG that declares the datasets the saved queries read (PLATFORM_DAG): its analytics'
# columns and types are taken from its SQL, so a column added there is built here too.
PLATFORM_DAG_FILE = Path(saved.__file__).parents[1] / "lite" / "dags" / "monad_demo.yaml"
# The decoded datasets' schemas, as the decode operators declare them (the analytics' inputs).
DECODED = {"erc20_transfers": TRANSFERS_SCHEMA, "staking_events": STAKING_SCHEMA}
# Cryo's datasets as far as the saved queries read them (their schemas are Cryo's, not this
# repository's); the hot window is the blocks' own columns.
RAW = {
    "blocks": {"block_number": "int", "gas_used": "int", "timestamp": "int"},
    "transactions": {
        "block_number": "int",
        "transaction_index": "int",
        "from_address": "string",
        "gas_used": "int",
    },
}
HOT = {"blocks_hot": "blocks"}
ARROW = {"int": pa.int64(), "double": pa.float64(), "string": pa.string(), "amount": ARROW_LIMBS}
# A parameter value for every saved query's parameter (only those it declares are passed).
PARAMS = {"token": TOKEN, "n": 10, "window_end": -1}
# A query over the hot window and a cold dataset (not a saved one).
JOIN = (
    "hot+cold join",
    "SELECT count(*), sum(t.gas_used) FROM blocks_hot h JOIN transactions t USING (block_number)",
    {},
)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


# -- what the datasets look like: from the platform DAG and the decode operators ---------------
def _ddl_kinds(ddl: str) -> dict[str, str]:
    """`name TYPE, ...` (Spark DDL) as column -> kind."""
    kinds = {"BIGINT": "int", "INT": "int", "STRING": "string", "DOUBLE": "double"}
    return {
        name: "amount" if typ.startswith("STRUCT") else kinds[typ]
        for name, typ in re.findall(r"(\w+) (STRUCT<[^>]*>|\w+)", ddl)
    }


def _kind(e: exp.Expression, known: dict[str, str]) -> str | None:
    """The kind (int, double, string, amount) of a Spark SQL expression, given its columns'."""
    e = e.unalias()
    if isinstance(e, exp.Anonymous) and str(e.this).lower().startswith("u256"):
        return "double" if str(e.this).lower() == "u256_double" else "amount"
    if isinstance(e, exp.Column):
        return known.get(e.name)
    if isinstance(e, exp.Count | exp.RowNumber | exp.Rank | exp.DenseRank):
        return "int"
    if isinstance(e, exp.Literal):
        return "string" if e.is_string else ("int" if e.is_int else "double")
    if isinstance(e, exp.Cast | exp.TryCast):
        t = e.to.this
        return (
            "int"
            if t in exp.DataType.INTEGER_TYPES
            else "string"
            if t in exp.DataType.TEXT_TYPES
            else "double"
        )
    if isinstance(e, exp.Div):
        return "double"
    if isinstance(e, exp.Case):
        branches = [i.args.get("true") for i in e.args.get("ifs") or []] + [e.args.get("default")]
        return next((k for b in branches if b is not None and (k := _kind(b, known))), None)
    args = [a for a in e.iter_expressions() if isinstance(a, exp.Expression)]
    if isinstance(e, exp.Binary) and any(_kind(a, known) == "double" for a in args):
        return "double"
    # An aggregate, a window, a function of a column, arithmetic: its first argument's kind.
    return next((k for a in args if (k := _kind(a, known))), None)


def declared_schemas() -> dict[str, dict[str, str]]:
    """Every dataset the platform DAG's sql_transform jobs publish, as column -> kind, in the
    order of its SQL's SELECT list: the kinds followed from the decode operators' schemas
    through each job's SQL (its aliases and CTEs included)."""
    spec = yaml.safe_load(PLATFORM_DAG_FILE.read_text())
    published = {(p["job"], p["output_index"]): p["dataset"] for p in spec["publish"]}
    out = {name: _ddl_kinds(ddl) for name, ddl in DECODED.items()}
    todo = {j: s for j, s in spec["jobs"].items() if s.get("operator") == "sql_transform"}

    def reads(job_spec: dict[str, Any]) -> list[str]:  # unpublished inputs (windows) aside
        inputs = [published.get((i["job"], i["output"])) for i in job_spec.get("inputs", [])]
        return [d for d in inputs if d is not None]

    while todo:
        ready = [j for j, s in todo.items() if all(d in out for d in reads(s))]
        if not ready:
            raise SystemExit(
                f"{PLATFORM_DAG_FILE.name}: cannot follow the schemas of {sorted(todo)}"
            )
        for job in ready:
            spec_ = todo.pop(job)
            known: dict[str, str] = {}
            for d in reads(spec_):
                known |= out[d]
            tree = sqlglot.parse_one(spec_["config"]["sql"], read="spark")
            for _ in range(4):  # aliases defined in terms of other aliases: to a fixed point
                for a in tree.find_all(exp.Alias):
                    if k := _kind(a.this, known):
                        known.setdefault(a.alias, k)
            out[published[(job, 0)]] = {
                s.alias_or_name: _kind(s, known) or "double" for s in tree.selects
            }
    return out


def saved_queries(blocks: int) -> list[tuple[str, str, dict[str, Any]]]:
    """Every saved query, with the bench's value for each parameter it declares."""
    every = max(1, blocks // 200)
    given = {**PARAMS, "every": every}
    out = []
    for name in saved.names():
        q = saved.load(name)
        out.append((name, q.sql, q.params({k: v for k, v in given.items() if k in q.defaults})))
    return out


def datasets_read(qs: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    return sorted(set().union(*(guard.dataset_names(sql) for _, sql, _ in qs)))


def bench_dag(names: list[str]) -> str:
    """A DAG publishing every dataset the queries read: Cryo's (and the hot window) from an
    ingest job, the analytics from a no-op job (their data is committed by `make_data`)."""
    analytics = [n for n in names if n not in RAW and n not in HOT]
    outs = ", ".join("{}" for _ in analytics)
    lines = [
        "name: bench",
        "jobs:",
        f"  ingest: {{operator: noop, outputs: [{', '.join('{}' for _ in RAW)}]}}",
        "  hot:",
        "    operator: hot_window",
        "    inputs: [{job: ingest, output: 0}]",
        "    outputs: [{backend: postgres}]",
        f"  analytics: {{operator: noop, outputs: [{outs}]}}",
        "publish:",
    ]
    lines += [f"  - {{job: ingest, output_index: {i}, dataset: {n}}}" for i, n in enumerate(RAW)]
    lines.append("  - {job: hot, output_index: 0, dataset: blocks_hot, hot_window: {of: blocks}}")
    lines += [
        f"  - {{job: analytics, output_index: {i}, dataset: {n}}}" for i, n in enumerate(analytics)
    ]
    return "\n".join(lines) + "\n"


def shaped(name: str, kinds: dict[str, str], n: int, given: dict[str, Any], rng: Any) -> pa.Table:
    """`name`'s table with exactly the declared columns, in their order and kinds: the values the bench
    shapes for the columns it knows (`given`), and for any other column (one added since)
    values of its kind."""
    cols: dict[str, pa.Array] = {}
    for col, kind in kinds.items():
        v = given.get(col)
        if v is None:
            v = {
                "int": lambda: range(n),
                "double": lambda: rng.random(n),
                "string": lambda: [f"0x{i:040x}" for i in rng.integers(0, 5000, n)],
                "amount": lambda: rng.integers(1, 10**6, n) * 10**12,
            }[kind]()
        if kind == "amount":
            v = [None if x is None else limbs(int(x)) for x in v]
        cols[col] = pa.array(v, ARROW[kind])
    return pa.table(cols)  # a shaped column the DAG no longer declares is left out


def make_data(svc: Services, blocks: int, hot: int, names: list[str]) -> dict[str, int]:
    """Commits every dataset in `names` (rows per dataset returned)."""
    import numpy as np

    declared = declared_schemas() | RAW
    missing = [n for n in names if n not in declared and n not in HOT]
    if missing:
        raise SystemExit(f"no declared schema for {missing} (read by the saved queries)")
    rng = np.random.default_rng(7)
    rows: dict[str, int] = {}

    def commit(name: str, n: int, given: dict[str, Any], a: int = 0, b: int = blocks) -> pa.Table:
        table = shaped(name, declared[name], n, given, rng)
        commit_parquet(svc, name, table, a, b)
        rows[name] = rows.get(name, 0) + n
        return table

    chunk = max(1, blocks // 4)
    for a in range(0, blocks, chunk):
        b = min(blocks, a + chunk)
        n = np.arange(a, b, dtype=np.int64)
        blk = commit(
            "blocks",
            len(n),
            {
                "block_number": n,
                "gas_used": rng.integers(0, 30_000_000, len(n)),
                "timestamp": n * 1 + 1_750_000_000,
            },
            a,
            b,
        )
        tn = np.repeat(n, 5)
        commit(
            "transactions",
            len(tn),
            {
                "block_number": tn,
                "transaction_index": np.tile(np.arange(5), len(n)),
                "from_address": [f"0x{i:040x}" for i in rng.integers(0, 5000, len(tn))],
                "gas_used": rng.integers(21_000, 500_000, len(tn)),
            },
            a,
            b,
        )
        if b > blocks - hot:
            lo = max(a, blocks - hot)
            rows["blocks_hot"] = rows.get("blocks_hot", 0) + load_hot(
                svc, "blocks_hot", blk.slice(lo - a), a, b, window=hot
            )
    # The analytics, shaped as the platform DAG's jobs write them (amounts as limbs).
    windows, validators = max(1, blocks // 100), 100
    window_end = np.arange(windows) * 100 + 99
    mints = np.sort(rng.choice(blocks, size=min(blocks, 20_000), replace=False))
    delta = rng.integers(1, 10**6, len(mints)) * 10**12
    accounts, changes = 1000, max(1, blocks // 400)
    acct = np.repeat(np.arange(accounts), changes)
    bal = np.cumsum(rng.integers(1, 10**6, (accounts, changes)), axis=1).ravel() * 10**12
    stake = rng.integers(1, 10**6, windows * validators) * 10**15
    per_window = np.repeat(stake.reshape(windows, validators).sum(axis=1), validators)
    shapes: dict[str, tuple[int, dict[str, Any]]] = {
        "token_supply": (
            len(mints),
            {
                "token_address": [TOKEN] * len(mints),
                "block_number": mints,
                "supply_delta": delta,
                "total_supply": np.cumsum(delta),
            },
        ),
        "token_balances": (
            len(acct),
            {
                "token_address": [TOKEN] * len(acct),
                "account": [f"0x{i:040x}" for i in acct],
                "block_number": np.sort(
                    rng.integers(0, blocks, (accounts, changes)), axis=1
                ).ravel(),
                "delta": [0] * len(acct),
                "balance": bal,
            },
        ),
        "validator_stake": (
            windows * validators,
            {
                "window_end": np.repeat(window_end, validators),
                "window_start": np.repeat(window_end - 99, validators),
                "epoch": np.repeat(np.arange(windows), validators),
                "validator_id": np.tile(np.arange(1, validators + 1), windows),
                "stake": stake,
                "share": stake / per_window,
                "stake_rank": np.tile(np.arange(1, validators + 1), windows),
            },
        ),
        "staking_concentration": (
            windows,
            {
                "window_end": window_end,
                "epoch": np.arange(windows),
                "validators": np.full(windows, validators),
                "total_stake": [10**20] * windows,
                "hhi": rng.random(windows) / 10,
                "nakamoto_coefficient": np.full(windows, 20),
                "top_share": rng.random(windows) / 10,
            },
        ),
        "delegator_concentration": (
            windows * validators,
            {
                "window_end": np.repeat(window_end, validators),
                "epoch": np.repeat(np.arange(windows), validators),
                "validator_id": np.tile(np.arange(1, validators + 1), windows),
                "delegators": rng.integers(1, 50, windows * validators),
                "total_stake": stake,
                "top_delegator_share": rng.random(windows * validators),
                "hhi": rng.random(windows * validators),
            },
        ),
    }
    for name in names:
        if name in RAW or name in HOT:
            continue
        n, given = shapes.get(name, (windows, {}))  # a new dataset: rows of its declared kinds
        commit(name, n, given)
    return rows


def queries(blocks: int) -> list[tuple[str, str, dict[str, Any]]]:
    return [*saved_queries(blocks), JOIN]


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
    for p in pins.values():  # amounts (limbs) read as BIGNUM, as the engine's views read them
        amounts = bignum.amount_columns(con, _source(p)) if p.files else ()
        con.execute(f'CREATE VIEW "{p.name}" AS {view_sql(p, amounts)}')
    return con


def bare_query(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> pa.Table:
    """Bare DuckDB's answer, its BIGNUMs as exact text as every Query Service path returns them."""
    return bignum.to_text(con.execute(sql, params or None).to_arrow_table())


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
    ap.add_argument("--warmup", type=int, default=3, help="unmeasured runs of each path first")
    args = smoke.parse_args(ap, blocks=2_000, hot=200, repeat=1, warmup=0)
    with migrated_postgres("trace-qbench-") as (root, dsn):
        settings = Settings(state_dsn=dsn, home=root / "home", auth="permissive")
        svc = Services.build(settings, dsn)
        with svc.pool.connection() as conn:
            me = lite_admin(conn)
        qs = queries(args.blocks)
        names = datasets_read(qs)
        svc.control.deploy(me, bench_dag(names))
        t0 = time.perf_counter()
        built = make_data(svc, args.blocks, args.hot, names)
        print(
            f"machine: {os.cpu_count()} cores; {args.blocks:,} blocks, {args.blocks * 5:,} txs, "
            f"hot window {args.hot:,} blocks in Postgres; data built in {time.perf_counter() - t0:.1f}s"
        )
        server = ApiServer(svc, "127.0.0.1", free_port(), background=False)
        server.start()
        http = httpx.Client(base_url=server.url, timeout=60)
        bare = bare_connection(svc, me, [sql for _, sql, _ in qs])
        for name, n in built.items():  # every row built is read back, no more
            got = bare.execute(f'SELECT count(*) FROM "{name}"').fetchone()
            if got is None or got[0] != n:
                raise SystemExit(f"refusing to print: {name} reads {got} rows, {n} were built")
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
            want = bare_query(bare, sql, params)  # the reference
            rows = want.num_rows
            expected = json.loads(json.dumps(formats.rows(want)))

            for i in range(args.repeat + args.warmup):
                order = list(t)
                rng.shuffle(order)  # no path always runs first (or right after another)
                for k in order:
                    body: dict[str, Any] = {}
                    t0 = time.perf_counter()
                    if k == "bare":
                        got = bare_query(bare, sql, params)
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
                    if i >= args.warmup:  # warm-up excluded
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


if __name__ == "__main__":
    smoke.main(main)
