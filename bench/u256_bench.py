"""What exact amounts cost: decode and the demo's token analytics with the exact representation
(nine BIGINT limbs, on disk and in Spark: trace_platform.spark.u256) against the DECIMAL(38,0)
path Trace had before (kept here only, for this comparison), on the same data, in one run.

Synthetic ERC-20 Transfer logs (--logs of them over --tokens tokens and --accounts accounts,
amounts below 10^30 so that the old path is exact too and the results can be compared). Each
step runs through the real operators on a local object store (decode_erc20_transfers, and
sql_transform with the demo DAG's SQL for token_supply and token_balances), old and new
interleaved, --repeat times after one warm-up round; the medians are printed with their ratio,
as wall time and as CPU time (this process, the Spark JVM and its Python workers: on a shared
machine the CPU time is the steadier figure).

Nothing is printed unless both paths did the work: same row counts, and the same numbers (the
old DECIMAL and the new limbs as Python integers) for every decoded transfer and every
analytics row.

    python bench/u256_bench.py [--logs 300000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import amounts
from tests.support.operators import put_table, read_output, run_operator
from tests.support.proc import tree_cpu

import smoke  # this folder's: run as a script
import trace_platform.spark as tspark
from trace_platform.chain import topic0
from trace_platform.contract import RangeSpec
from trace_platform.objectstore.local import LocalStore
from trace_platform.operators import decode
from trace_platform.operators.context import OperatorContext, OperatorResult
from trace_platform.operators.output import publish_frame
from trace_platform.operators.sql_transform import sql_transform

DEMO = Path(__file__).resolve().parents[1] / "examples" / "dags" / "monad_demo.yaml"
TRANSFER = bytes.fromhex(topic0("Transfer(address,address,uint256)")[2:])
ZERO = b"\x00" * 20

# --- the DECIMAL(38,0) path as it was (for comparison only) -----------------------------------


def _decimal_transfers(logs: Any) -> Any:
    """Trace's transfers frame before exact amounts: each word's exact text in Python, then
    try_cast to DECIMAL(38,0) (NULL and value_overflow past it)."""
    from pyspark.sql import functions as F
    from pyspark.sql.functions import udf
    from pyspark.sql.types import StringType

    uint_text = udf(
        lambda b: None if b is None else str(int.from_bytes(bytes(b), "big")), StringType()
    )
    frame = logs.where(
        (F.lower(F.hex("topic0")) == decode.TRANSFER[2:])
        & F.col("topic3").isNull()
        & (F.length("data") == 32)
    ).select(
        F.col("block_number").cast("long").alias("block_number"),
        F.concat(F.lit("0x"), F.lower(F.hex("transaction_hash"))).alias("tx_hash"),
        F.col("log_index").cast("int").alias("log_index"),
        F.concat(F.lit("0x"), F.lower(F.hex("address"))).alias("token_address"),
        F.concat(F.lit("0x"), F.lower(F.hex(F.substring("topic1", 13, 20)))).alias("from_address"),
        F.concat(F.lit("0x"), F.lower(F.hex(F.substring("topic2", 13, 20)))).alias("to_address"),
        uint_text("data").alias("value_text"),
    )
    return frame.withColumn("value", F.expr("try_cast(value_text AS DECIMAL(38,0))")).withColumn(
        "value_overflow", F.col("value").isNull()
    )


def _decimal_decode(ctx: OperatorContext) -> OperatorResult:
    start, end = decode._range(ctx)
    logs = decode._read_logs(ctx, start, end)  # as the shipped decode reads its range
    return publish_frame(
        ctx,
        _decimal_transfers(logs),
        RangeSpec(start=start, end=end),
        order=("block_number", "log_index"),
    )


DECIMAL_SQL = {
    "token_supply": """
        SELECT token_address, block_number, supply_delta,
               SUM(supply_delta) OVER (PARTITION BY token_address ORDER BY block_number
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS total_supply
        FROM (
          SELECT token_address, block_number,
                 SUM(CASE WHEN from_address = '0x0000000000000000000000000000000000000000' THEN value
                          ELSE -value END) AS supply_delta
          FROM erc20_transfers
          WHERE from_address = '0x0000000000000000000000000000000000000000'
             OR to_address = '0x0000000000000000000000000000000000000000'
          GROUP BY token_address, block_number
        )
        ORDER BY token_address, block_number""",
    "token_balances": """
        SELECT token_address, account, block_number, delta,
               SUM(delta) OVER (PARTITION BY token_address, account ORDER BY block_number
                                ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS balance
        FROM (
          SELECT token_address, account, block_number, SUM(delta) AS delta
          FROM (
            SELECT token_address, to_address AS account, block_number, value AS delta
            FROM erc20_transfers WHERE to_address <> '0x0000000000000000000000000000000000000000'
            UNION ALL
            SELECT token_address, from_address AS account, block_number, -value AS delta
            FROM erc20_transfers WHERE from_address <> '0x0000000000000000000000000000000000000000'
          )
          GROUP BY token_address, account, block_number
        )
        ORDER BY token_address, account, block_number""",
}

# --- measuring ------------------------------------------------------------------------------


# --- data --------------------------------------------------------------------------------------


def transfer_logs(n: int, tokens: int, accounts: int, blocks: int, seed: int = 1) -> pa.Table:
    rnd = random.Random(seed)
    people = [rnd.randbytes(20) for _ in range(accounts)]
    addresses = [rnd.randbytes(20) for _ in range(tokens)]
    block_numbers = sorted(rnd.randrange(blocks) for _ in range(n))
    topics1, topics2 = [], []
    for _ in range(n):
        kind = rnd.random()
        topics1.append(b"\x00" * 12 + (ZERO if kind < 0.2 else rnd.choice(people)))
        topics2.append(b"\x00" * 12 + (ZERO if 0.2 <= kind < 0.3 else rnd.choice(people)))
    return pa.table(
        {
            "block_number": pa.array(block_numbers, pa.int64()),
            "transaction_hash": pa.array([i.to_bytes(32, "big") for i in range(n)]),
            "log_index": pa.array([0] * n, pa.int32()),
            "address": pa.array([rnd.choice(addresses) for _ in range(n)]),
            "topic0": pa.array([TRANSFER] * n),
            "topic1": pa.array(topics1),
            "topic2": pa.array(topics2),
            "topic3": pa.array([None] * n, pa.binary()),
            "data": pa.array([rnd.randrange(1, 10**30).to_bytes(32, "big") for _ in range(n)]),
        }
    )


# --- the run -----------------------------------------------------------------------------------


Cost = tuple[float, float]  # wall seconds, CPU seconds


class Bench:
    def __init__(self, root: Path, logs: pa.Table) -> None:
        self.store = LocalStore(root / "store")
        self.work = root / "work"
        self.logs = put_table(self.store, "in/logs/", logs)
        self.rng = RangeSpec(start=0, end=int(pc.max(logs["block_number"]).as_py()) + 1)
        self.n = 0

    def _out(self) -> str:
        self.n += 1
        return f"out/{self.n}/"

    def decode(self, exact: bool) -> tuple[Cost, str]:
        fn: Callable[[OperatorContext], OperatorResult] = (
            decode.decode_erc20_transfers if exact else _decimal_decode
        )
        t0, c0 = time.perf_counter(), tree_cpu()
        _, loc = run_operator(
            fn, self.store, self.work, [("logs", self.logs)], self._out(), rng=self.rng
        )
        return (time.perf_counter() - t0, tree_cpu() - c0), loc

    def analytic(self, sql: str, transfers: str) -> tuple[Cost, str]:
        t0, c0 = time.perf_counter(), tree_cpu()
        _, loc = run_operator(
            sql_transform,
            self.store,
            self.work,
            [("erc20_transfers", transfers)],
            self._out(),
            {"sql": sql},
        )
        return (time.perf_counter() - t0, tree_cpu() - c0), loc

    def table(self, location: str) -> pa.Table:
        return read_output(self.store, location)


def _numbers(t: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    """Rows (sorted) with every listed column as a Python int: DECIMAL and limbs alike."""
    cols = []
    for name in t.column_names:
        values = t[name].to_pylist()
        if name in columns:
            values = [amounts.value(v) if isinstance(v, dict) else int(v) for v in values]
        cols.append(values)
    return sorted(zip(*cols, strict=True))


def verify(b: Bench, old: dict[str, str], new: dict[str, str]) -> list[str]:
    """What differs between the two paths' outputs (empty: same rows, same numbers)."""
    problems = []
    o, n = b.table(old["decode"]), b.table(new["decode"])
    if o.num_rows != n.num_rows or o.num_rows == 0:
        problems.append(f"decode rows: {o.num_rows} (DECIMAL) vs {n.num_rows} (exact)")
    elif pc.any(o["value_overflow"]).as_py():
        problems.append("the DECIMAL path overflowed: it is not exact on this data")
    else:
        keep = ["tx_hash", "log_index", "value"]
        if _numbers(o.select(keep), ["value"]) != _numbers(n.select(keep), ["value"]):
            problems.append("decode: values differ")
    for job, cols in {
        "token_supply": ["supply_delta", "total_supply"],
        "token_balances": ["delta", "balance"],
    }.items():
        o, n = b.table(old[job]), b.table(new[job])
        if o.num_rows != n.num_rows or o.num_rows == 0:
            problems.append(f"{job} rows: {o.num_rows} (DECIMAL) vs {n.num_rows} (exact)")
        elif _numbers(o, cols) != _numbers(n, cols):
            problems.append(f"{job}: results differ")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", type=int, default=300_000)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--accounts", type=int, default=5_000)
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = smoke.parse_args(ap, logs=2_000, tokens=3, accounts=50, blocks=1_000, repeat=0)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    exact_sql = {
        job: yaml.safe_load(DEMO.read_text())["jobs"][job]["config"]["sql"] for job in DECIMAL_SQL
    }
    costs: dict[tuple[str, bool], list[Cost]] = {}
    with tempfile.TemporaryDirectory(prefix="trace-u256-bench-") as tmp:
        b = Bench(Path(tmp), transfer_logs(args.logs, args.tokens, args.accounts, args.blocks))
        tspark.get_spark()  # the JVM start is not what is measured
        for round_ in range(args.repeat + 1):  # round 0 warms the JVM up, unmeasured
            locs: dict[bool, dict[str, str]] = {}
            for exact in (False, True) if round_ % 2 == 0 else (True, False):
                cost, loc = b.decode(exact)
                locs[exact] = {"decode": loc}
                measured = [("decode", cost)]
                for job in DECIMAL_SQL:
                    sql = exact_sql[job] if exact else DECIMAL_SQL[job]
                    cost, locs[exact][job] = b.analytic(sql, loc)
                    measured.append((job, cost))
                if round_ or not args.repeat:  # --repeat 0: the warm-up round is reported
                    for step, cost in measured:
                        costs.setdefault((step, exact), []).append(cost)
            problems = verify(b, locs[False], locs[True])
            if problems:
                print("refusing to print figures: " + "; ".join(problems), file=sys.stderr)
                return 1
        rows = {step: b.table(loc).num_rows for step, loc in locs[True].items()}
    tspark.stop_spark()
    report(args, rows, costs)
    return 0


def report(args: Any, rows: dict[str, int], costs: dict[tuple[str, bool], list[Cost]]) -> None:
    print(
        f"{args.logs:,} Transfer logs, {args.tokens} tokens, {args.accounts:,} accounts; "
        f"median of {args.repeat} rounds after a warm-up one, real operators on a local store; "
        "both paths' results verified equal on every round"
    )
    head = f"{'step':<16}{'rows out':>10}  {'wall: DECIMAL':>13}{'exact':>8}{'ratio':>7}"
    print(head + f"  {'CPU: DECIMAL':>12}{'exact':>8}{'ratio':>7}")
    total = {(e, i): 0.0 for e in (False, True) for i in (0, 1)}
    for step in ("decode", *DECIMAL_SQL):
        line = f"{step:<16}{rows[step]:>10,}"
        for i in (0, 1):  # wall, CPU
            old = statistics.median(c[i] for c in costs[(step, False)])
            new = statistics.median(c[i] for c in costs[(step, True)])
            total[(False, i)] += old
            total[(True, i)] += new
            line += f"  {old:>12.2f}s{new:>7.2f}s{new / old:>6.2f}x"
        print(line)
    line = f"{'all three':<16}{'':>10}"
    for i in (0, 1):
        old, new = total[(False, i)], total[(True, i)]
        line += f"  {old:>12.2f}s{new:>7.2f}s{new / old:>6.2f}x"
    print(line + "   (target <= 1.5x)")


if __name__ == "__main__":
    smoke.main(main)
