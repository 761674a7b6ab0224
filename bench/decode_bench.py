"""Spark decode throughput (rows/s) against the same decode in polars, one process, the same
Parquet, the same output.

A synthetic logs file (deterministic, --seed) with Cryo's logs columns and types (block_number,
transaction_index, log_index UINT32; block_hash, transaction_hash, address, topic0..topic3,
data BINARY, topics nullable; n_data_bytes UINT32; chain_id UINT64), written as cryo_ingest
stores it (pyarrow, zstd, row groups of cryo_ingest.ROW_GROUP_ROWS rows, 128Ki, which Spark
splits across its cores; --row-group-rows to change, 0 for pyarrow's default: one group up to
1,048,576 rows, read in one task). The rows mix ERC-20 Transfers (three
topics, a 32-byte word; amounts across the whole uint256 range: 0, small, past 2^64, past
10^38, past 2^255, 2^256-1 and the edges around them), ERC-721 Transfers (four topics:
excluded), a few Transfers with a 64-byte data (excluded), the staking contract's events (all
seven kinds; Delegate and Undelegate amounts across the same range), staking events from
another address (excluded) and unrelated logs.

Each dataset is timed from reading the Parquet to its output Parquet written (snappy, Spark's
default; Spark writes its partitions' files, no coalesce):

- Spark: `transfers_frame` and `staking_frame` (trace_platform.operators.decode), in the
  project's operator SparkSession (trace_platform.spark: ANSI mode, the JIT option, UI off) on
  --master (local[2]) with --partitions shuffle partitions.
- polars: the same decode written with polars expressions (the amounts as the same nine-limb
  structs, made natively: Int128 sums of the word's four 64-bit parts, carried), on as many
  threads as Spark has cores.

One warm-up round (unmeasured), then --repeat rounds, the two sides' order alternating; the
medians are printed (wall and CPU time of the whole process tree). Nothing is printed unless,
on every round, both outputs hold the same rows (counts per dataset, every column equal after
sorting by block and log index) and every amount, as a Python integer (Spark's limbs via
tests/support/amounts.value), equals the one the generator put in the logs.

--profile adds Spark's stages (read only, decode to the noop sink, decode to Parquet) and the
physical plans.

    SPARK_LOCAL_IP=127.0.0.1 python bench/decode_bench.py [--rows 1000000 | --quick]
        [--repeat 3] [--master local[2]] [--partitions 2] [--row-group-rows N] [--profile]
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
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import amounts
from tests.support.proc import tree_cpu

import smoke  # this folder's: run as a script
from trace_platform.operators import decode, output
from trace_platform.operators.cryo_ingest import ROW_GROUP_ROWS
from trace_platform.spark import JIT_OPTIONS
from trace_platform.spark.u256 import BASE, FIELDS, TOP

TRANSFER = bytes.fromhex(decode.TRANSFER[2:])
STAKING = {name: bytes.fromhex(t[2:]) for name, t in decode.STAKING.items()}
STAKING_ADDRESS = bytes.fromhex(decode.STAKING_ADDRESS[2:])
OTHER_ADDRESS = bytes.fromhex("00" * 18 + "2000")
CHAIN_ID = 10143
LOGS_PER_BLOCK = 100
COMPRESSION = "snappy"
DATASETS = ("erc20_transfers", "staking_events")
KEY = ["block_number", "log_index"]
# The columns each decode reads.
_SHARED = ["block_number", "transaction_hash", "log_index", "address", "topic0", "topic1", "topic2"]
READS = {"erc20_transfers": [*_SHARED, "topic3", "data"], "staking_events": [*_SHARED, "data"]}
AMOUNT = {"erc20_transfers": "value", "staking_events": "amount_delta"}

# --- the data ----------------------------------------------------------------------------------

EDGES = [
    0,
    1,
    BASE - 1,
    BASE,
    2**63 - 1,
    2**64 - 1,
    2**64,
    10**38 - 1,
    10**38,
    10**38 + 1,
    2**128,
    2**255 - 1,
    2**255,
    2**256 - 2,
    2**256 - 1,
]


BANDS = [(1, 2**32), (2**32, 2**64), (2**64, 10**38), (10**38, 2**255), (2**255, 2**256)]


def amount(rnd: random.Random) -> int:
    """An amount from one of seven bands across the uint256 range, the edges included."""
    band = rnd.randrange(len(BANDS) + 1)
    if band == len(BANDS):
        return rnd.choice(EDGES)
    return rnd.randrange(*BANDS[band])


def word(n: int) -> bytes:
    return n.to_bytes(32, "big")


def topic_address(rnd: random.Random, people: list[bytes]) -> bytes:
    return b"\x00" * 12 + rnd.choice(people)


# What each staking event's data holds (after its two indexed topics), and where its amount is.
def staking_log(
    rnd: random.Random, name: str, people: list[bytes]
) -> tuple[list[bytes | None], bytes, int | None]:
    """(topics 1..3, data, the amount_delta expected) of one staking event."""
    epoch = rnd.randrange(2**40)
    if name == "EpochChanged":
        return [None, None, None], word(epoch - 1) + word(epoch), 0
    topics: list[bytes | None] = [word(rnd.randrange(1, 2**40)), topic_address(rnd, people), None]
    value = amount(rnd)
    if name == "ValidatorCreated":
        return topics, word(value), 0
    if name in ("Delegate", "ClaimRewards", "ValidatorRewarded"):
        return topics, word(value) + word(epoch), value if name == "Delegate" else 0
    withdraw_id = word(rnd.randrange(256))  # Undelegate, Withdraw
    return topics, withdraw_id + word(value) + word(epoch), -value if name == "Undelegate" else 0


Expected = dict[str, dict[tuple[int, int], int]]  # dataset -> (block, log index) -> amount


def make_logs(n: int, seed: int) -> tuple[pa.Table, Expected, dict[str, int]]:
    """n logs in Cryo's schema, what each dataset must hold (its amounts by key), and how many
    logs of each kind were made."""
    rnd = random.Random(seed)
    people = [rnd.randbytes(20) for _ in range(2000)]
    tokens = [rnd.randbytes(20) for _ in range(50)]
    others = [rnd.randbytes(32) for _ in range(20)]
    kinds = ["transfer", "erc721", "transfer64", "staking", "staking_other", "other"]
    weights = [45, 10, 1, 20, 2, 22]
    names = list(STAKING)
    cols: dict[str, list[Any]] = {
        c: []
        for c in (
            "block_number",
            "block_hash",
            "transaction_index",
            "log_index",
            "transaction_hash",
            "address",
            "topic0",
            "topic1",
            "topic2",
            "topic3",
            "data",
        )
    }
    expected: Expected = {d: {} for d in DATASETS}
    made = dict.fromkeys(kinds, 0)
    block_hash = tx_hash = b""
    for i in range(n):
        block, index = 20_000_000 + i // LOGS_PER_BLOCK, i % LOGS_PER_BLOCK
        if index == 0:
            block_hash = rnd.randbytes(32)
        if index % 4 == 0:
            tx_hash = rnd.randbytes(32)
        kind = rnd.choices(kinds, weights)[0]
        made[kind] += 1
        topic0: bytes | None
        if kind in ("transfer", "erc721", "transfer64"):
            topic0, address = TRANSFER, rnd.choice(tokens)
            topics = [topic_address(rnd, people), topic_address(rnd, people), None]
            value = amount(rnd)
            data = word(value)
            if kind == "erc721":
                topics[2], data = word(rnd.randrange(2**20)), b""
            elif kind == "transfer64":
                data += word(0)
            else:
                expected["erc20_transfers"][(block, index)] = value
        elif kind.startswith("staking"):
            name = rnd.choice(names)
            topic0 = STAKING[name]
            topics, data, delta = staking_log(rnd, name, people)
            if kind == "staking":
                address = STAKING_ADDRESS
                expected["staking_events"][(block, index)] = delta
            else:
                address = OTHER_ADDRESS
        else:
            count = rnd.randrange(5)
            topic0 = rnd.choice(others) if count else None
            topics = [rnd.randbytes(32) if k < count - 1 else None for k in range(3)]
            address = rnd.choice([*tokens, STAKING_ADDRESS])
            data = rnd.randbytes(32 * rnd.randrange(5))
        for c, v in zip(
            cols,
            [block, block_hash, index // 4, index, tx_hash, address, topic0, *topics, data],
            strict=True,
        ):
            cols[c].append(v)
    u32, binary = pa.uint32(), pa.binary()
    table = pa.table(
        {
            "block_number": pa.array(cols["block_number"], u32),
            "block_hash": pa.array(cols["block_hash"], binary),
            "transaction_index": pa.array(cols["transaction_index"], u32),
            "log_index": pa.array(cols["log_index"], u32),
            "transaction_hash": pa.array(cols["transaction_hash"], binary),
            "address": pa.array(cols["address"], binary),
            **{f"topic{k}": pa.array(cols[f"topic{k}"], binary) for k in range(4)},
            "data": pa.array(cols["data"], binary),
            "n_data_bytes": pa.array([len(d) for d in cols["data"]], u32),
            "chain_id": pa.array([CHAIN_ID] * n, pa.uint64()),
        }
    )
    return table, expected, made


# --- measuring ---------------------------------------------------------------------------------


Cost = tuple[float, float]  # wall seconds, CPU seconds


def timed(fn: Callable[[], Any]) -> Cost:
    t0, c0 = time.perf_counter(), tree_cpu()
    fn()
    return time.perf_counter() - t0, tree_cpu() - c0


# --- Spark -------------------------------------------------------------------------------------


def spark_frames(spark: Any, logs_path: Path) -> dict[str, Any]:
    logs = spark.read.parquet(str(logs_path))
    return {
        "erc20_transfers": decode.transfers_frame(logs),
        "staking_events": decode.staking_frame(logs),
    }


def spark_decode(spark: Any, logs_path: Path, dataset: str, out: Path) -> None:
    from trace_platform.spark import u256

    frame = spark_frames(spark, logs_path)[dataset]
    with u256.invalid_amounts_fail():  # the operators' Parquet writer settings
        writer = output.parquet_writer(frame).mode("overwrite")
        writer.option("compression", COMPRESSION).parquet(str(out))


# --- polars ------------------------------------------------------------------------------------


def _word_parts() -> list[list[int]]:
    """The limbs (l0..l8) of each 64-bit part's weight, 2^192 down to 1."""
    out = []
    for i in range(4):
        w, limbs = 2 ** (64 * (3 - i)), []
        for _ in range(TOP + 1):
            w, limb = divmod(w, BASE)
            limbs.append(limb)
        out.append(limbs)
    return out


WEIGHTS = _word_parts()


def pl_hex(e: Any) -> Any:
    import polars as pl

    return pl.lit("0x") + e.bin.encode("hex")


def pl_word_limbs(lf: Any, word_col: str, prefix: str) -> tuple[Any, list[str]]:
    """`lf` with the limbs of the 32-byte words in `word_col` as columns `{prefix}l0`..`l8`:
    Int128 sums of the four big-endian 64-bit parts times their weights' limbs, carried into
    floor form (the same arithmetic as u256.word_limbs, in other units)."""
    import polars as pl

    parts = [
        pl.col(word_col)
        .bin.slice(8 * i, 8)
        .bin.reinterpret(dtype=pl.UInt64, endianness="big")
        .cast(pl.Int128)
        for i in range(4)
    ]
    sums = []
    for k in range(TOP + 1):
        terms = [p * w[k] for p, w in zip(parts, WEIGHTS, strict=True) if w[k]]
        sums.append(pl.sum_horizontal(terms) if terms else pl.lit(0, pl.Int128))
    lf = lf.with_columns(s.alias(f"{prefix}s{k}") for k, s in enumerate(sums))
    for k in range(TOP):  # t_k = s_k + t_(k-1) DIV B, in place of s_k
        t = pl.col(f"{prefix}s{k}")
        if k:
            t = t + pl.col(f"{prefix}s{k - 1}") // BASE
        lf = lf.with_columns(t.alias(f"{prefix}s{k}"))
    lf = lf.with_columns(
        *[(pl.col(f"{prefix}s{k}") % BASE).cast(pl.Int64).alias(f"{prefix}l{k}") for k in range(8)],
        (pl.col(f"{prefix}s{TOP}") + pl.col(f"{prefix}s{TOP - 1}") // BASE)
        .cast(pl.Int64)
        .alias(f"{prefix}l{TOP}"),
    ).drop([f"{prefix}s{k}" for k in range(TOP + 1)])
    return lf, [f"{prefix}l{k}" for k in range(TOP + 1)]


def pl_limbs_struct(names: list[str]) -> Any:
    """The struct l8..l0 (Spark's field order) of limb columns given l0..l8."""
    import polars as pl

    return pl.struct([pl.col(names[k]).alias(f"l{k}") for k in range(TOP, -1, -1)])


def pl_neg(limbs: list[Any]) -> list[Any]:
    """-x in floor form, limb by limb (u256.NEG's arithmetic)."""
    import polars as pl

    def lower_zero(k: int) -> Any:
        return pl.sum_horizontal(limbs[:k]) == 0

    out = []
    for k in range(TOP):
        own = pl.when(limbs[k] == 0).then(0).otherwise(BASE - limbs[k])
        out.append(
            own if k == 0 else pl.when(lower_zero(k)).then(own).otherwise(BASE - 1 - limbs[k])
        )
    out.append(-limbs[TOP] - pl.when(lower_zero(TOP)).then(0).otherwise(1))
    return out


def pl_transfers(logs_path: Path) -> Any:
    import polars as pl

    lf = pl.scan_parquet(logs_path).filter(
        (pl.col("topic0") == TRANSFER)
        & pl.col("topic3").is_null()
        & (pl.col("data").bin.size() == 32)
    )
    lf, limbs = pl_word_limbs(lf, "data", "_v")
    return lf.select(
        pl.col("block_number").cast(pl.Int64),
        pl_hex(pl.col("transaction_hash")).alias("tx_hash"),
        pl.col("log_index").cast(pl.Int32),
        pl_hex(pl.col("address")).alias("token_address"),
        pl_hex(pl.col("topic1").bin.slice(12, 20)).alias("from_address"),
        pl_hex(pl.col("topic2").bin.slice(12, 20)).alias("to_address"),
        pl_limbs_struct(limbs).alias("value"),
    )


def pl_staking(logs_path: Path) -> Any:
    import polars as pl

    event = pl.when(pl.col("topic0") == STAKING["ValidatorCreated"]).then(
        pl.lit("ValidatorCreated")
    )
    for name, t0 in list(STAKING.items())[1:]:
        event = event.when(pl.col("topic0") == t0).then(pl.lit(name))
    ev = pl.col("event")
    size = pl.col("data").bin.size()

    def small(i: int) -> Any:  # a uint64/uint8 word's low 8 bytes, unsigned
        return (
            pl.col("data")
            .bin.slice(32 * i + 24, 8)
            .bin.reinterpret(dtype=pl.UInt64, endianness="big")
        )

    lf = (
        pl.scan_parquet(logs_path)
        .filter(pl.col("address") == STAKING_ADDRESS)
        .with_columns(event.alias("event"))
        .filter(ev.is_not_null())
        .with_columns(
            pl.when(ev == "Delegate")
            .then(pl.col("data").bin.slice(0, 32))
            .when(ev == "Undelegate")
            .then(pl.col("data").bin.slice(32, 32))
            .alias("_word"),
            # A log too short to hold its amount fails the decode (checked after collect).
            (((ev == "Delegate") & (size < 32)) | ((ev == "Undelegate") & (size < 64))).alias(
                "_short"
            ),
        )
    )
    lf, limbs = pl_word_limbs(lf, "_word", "_a")
    cols = [pl.col(n) for n in limbs]
    neg = pl_neg(cols)
    delta = [
        pl.when(ev == "Undelegate")
        .then(neg[k])
        .when(ev == "Delegate")
        .then(cols[k])
        .otherwise(0)
        .cast(pl.Int64)
        .alias(f"_d{k}")
        for k in range(TOP + 1)
    ]
    lf = lf.with_columns(delta)
    not_epoch = ev != "EpochChanged"
    return lf.select(
        pl.col("block_number").cast(pl.Int64),
        pl_hex(pl.col("transaction_hash")).alias("tx_hash"),
        pl.col("log_index").cast(pl.Int32),
        ev,
        pl.when(not_epoch)
        .then(pl.col("topic1").bin.slice(24, 8).bin.reinterpret(dtype=pl.UInt64, endianness="big"))
        .cast(pl.Int64)
        .alias("validator_id"),
        pl.when(not_epoch).then(pl_hex(pl.col("topic2").bin.slice(12, 20))).alias("delegator"),
        pl.when(ev == "Delegate")
        .then(small(1))
        .when(ev == "Undelegate")
        .then(small(2))
        .when(ev == "Withdraw")
        .then(small(2))
        .when(ev.is_in(["ClaimRewards", "ValidatorRewarded"]))
        .then(small(1))
        .when(ev == "EpochChanged")
        .then(small(1))
        .cast(pl.Int64)  # the chosen word's only: a uint64 past a long fails, as in Spark
        .alias("epoch"),
        pl_limbs_struct([f"_d{k}" for k in range(TOP + 1)]).alias("amount_delta"),
        pl.col("_short"),
    )


def polars_decode(logs_path: Path, dataset: str, out: Path) -> None:
    frame = (pl_transfers if dataset == "erc20_transfers" else pl_staking)(logs_path).collect()
    if "_short" in frame.columns:
        short = frame.filter(frame["_short"])
        if short.height:
            row = short.row(0, named=True)
            raise ValueError(
                f"invalid amount in staking_events: {row['event']} log {row['tx_hash']}:"
                f"{row['log_index']} has no whole uint256 amount"
            )
        frame = frame.drop("_short")
    # Sorted by block and log index, as the Spark operators write each file's rows.
    frame.sort(["block_number", "log_index"]).write_parquet(out, compression=COMPRESSION)


# --- checking ----------------------------------------------------------------------------------


def read_sorted(path: Path) -> pa.Table:
    table = pq.read_table(path)
    return table.sort_by([(k, "ascending") for k in KEY])


def integers(column: pa.ChunkedArray) -> list[int | None]:
    """A limbs column as Python integers (tests/support/amounts.value, row by row)."""
    fields = [column.combine_chunks().field(f).to_pylist() for f in FIELDS]
    valid = column.is_valid().to_pylist()
    return [
        amounts.value(limbs) if ok else None
        for ok, limbs in zip(valid, zip(*fields, strict=True), strict=True)
    ]


def check(dataset: str, spark_out: Path, polars_out: Path, expected: Expected) -> list[str]:
    """What differs between the two outputs and the amounts the generator wrote (empty: none);
    and any output file whose rows are not in block and log order (the sort was timed)."""
    s, p = read_sorted(spark_out), read_sorted(polars_out)
    want = expected[dataset]
    problems = []
    files = sorted(spark_out.glob("*.parquet")) if spark_out.is_dir() else [spark_out]
    for f in [*files, polars_out]:
        t = pq.read_table(f, columns=KEY)
        order = pc.sort_indices(t, [(k, "ascending") for k in KEY])
        if order.to_pylist() != list(range(t.num_rows)):
            problems.append(f"{dataset}: {f.name}'s rows are not in block and log order")
    if not (s.num_rows == p.num_rows == len(want)) or not want:
        return [f"{dataset} rows: Spark {s.num_rows}, polars {p.num_rows}, made {len(want)}"]
    if s.column_names != p.column_names:
        return [f"{dataset} columns: Spark {s.column_names}, polars {p.column_names}"]
    for name in s.column_names:
        sc, pcol = s[name], p[name]
        if name != AMOUNT[dataset]:
            pcol = pcol.cast(sc.type)
        elif sc.type != pcol.type:
            problems.append(f"{dataset}.{name} types: Spark {sc.type}, polars {pcol.type}")
            continue
        if not sc.equals(pcol):
            problems.append(f"{dataset}.{name} differs between Spark and polars")
    keys = list(zip(s["block_number"].to_pylist(), s["log_index"].to_pylist(), strict=True))
    truth = [want.get(k) for k in keys]
    amount_col = AMOUNT[dataset]
    if integers(s[amount_col]) != truth:
        problems.append(f"{dataset}.{amount_col}: Spark's amounts are not the ones made")
    if integers(p[amount_col]) != truth:
        problems.append(f"{dataset}.{amount_col}: polars' amounts are not the ones made")
    return problems


def coverage(expected: Expected) -> str:
    """What range the checked amounts span."""
    values = [v for d in DATASETS for v in expected[d].values()]
    bands = {
        "0": sum(v == 0 for v in values),
        "<0": sum(v < 0 for v in values),
        ">=2^64": sum(abs(v) >= 2**64 for v in values),
        ">10^38": sum(abs(v) > 10**38 for v in values),
        ">=2^255": sum(abs(v) >= 2**255 for v in values),
        "2^256-1": sum(abs(v) == 2**256 - 1 for v in values),
    }
    checksum = sum(values) % 2**256
    return (
        ", ".join(f"{k}: {n:,}" for k, n in bands.items())
        + f"; checksum sum mod 2^256 = {checksum:#x}"
    )


# --- the run -----------------------------------------------------------------------------------


def profile(spark: Any, logs_path: Path, out: Path, repeat: int) -> None:
    """Spark's stages, each the median of `repeat` runs: the decode's input columns read (noop
    sink), the decode to noop, the decode to Parquet; and the plans."""
    from trace_platform.spark import u256

    def run(write: Callable[[], None]) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            with u256.invalid_amounts_fail():
                write()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    print(f"\nSpark stages (median of {repeat}, seconds):")
    print(f"{'dataset':<18}{'read only':>10}{'-> noop':>9}{'-> parquet':>11}")
    for dataset in DATASETS:
        frame = spark_frames(spark, logs_path)[dataset]
        inputs = READS[dataset]
        logs = spark.read.parquet(str(logs_path)).select(*inputs)
        read = run(lambda lg=logs: lg.write.format("noop").mode("overwrite").save())
        noop = run(lambda f=frame: f.write.format("noop").mode("overwrite").save())
        full = run(
            lambda f=frame, d=dataset: (
                output.parquet_writer(f)
                .mode("overwrite")
                .option("compression", COMPRESSION)
                .parquet(str(out / d))
            )
        )
        print(f"{dataset:<18}{read:>10.2f}{noop:>9.2f}{full:>11.2f}   (read: {', '.join(inputs)})")
    for dataset in DATASETS:
        print(f"\n--- {dataset}: physical plan")
        frame = spark_frames(spark, logs_path)[dataset]
        print(frame._jdf.queryExecution().executedPlan().toString()[:6000])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="100,000 rows")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--partitions", type=int, default=2, help="spark.sql.shuffle.partitions")
    ap.add_argument(
        "--row-group-rows",
        type=int,
        default=ROW_GROUP_ROWS,
        help="rows per input row group (default: cryo_ingest's; 0: pyarrow's, 1M rows a group)",
    )
    ap.add_argument("--profile", action="store_true", help="Spark's stages and plans too")
    args = smoke.parse_args(ap, rows=5_000, repeat=0)
    rows = 100_000 if args.quick else args.rows
    cores = os.cpu_count() or 1
    spark_cores = cores if args.master in ("local[*]", "local") else int(args.master[6:-1])
    if args.master == "local":
        spark_cores = 1
    # Both engines get the same cores; set before polars and the JVM start.
    os.environ.setdefault("POLARS_MAX_THREADS", str(spark_cores))
    os.environ["TRACE_SPARK_MASTER"] = args.master
    os.environ["TRACE_SPARK_SHUFFLE_PARTITIONS"] = str(args.partitions)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import polars as pl

    import trace_platform.spark as tspark

    costs: dict[tuple[str, str], list[Cost]] = {}
    out_rows: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="trace-decode-bench-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        table, expected, made = make_logs(rows, args.seed)
        logs_path = root / "logs.parquet"
        # As cryo_ingest stores it (its row groups, unless --row-group-rows).
        group = args.row_group_rows or None
        pq.write_table(table, logs_path, compression="zstd", row_group_size=group)
        meta = pq.ParquetFile(logs_path).metadata
        print(
            f"made {rows:,} logs in {time.perf_counter() - t0:.1f} s "
            f"({logs_path.stat().st_size / 2**20:.0f} MiB, {meta.num_row_groups} row group(s)): "
            + ", ".join(f"{k} {v:,}" for k, v in made.items())
        )
        del table
        spark = tspark.get_spark()  # the JVM start is not what is measured
        sides: dict[str, Callable[[Path, str, Path], None]] = {
            "Spark": lambda lp, d, o: spark_decode(spark, lp, d, o),
            "polars": polars_decode,
        }
        for round_ in range(args.repeat + 1):  # round 0 warms both up, unmeasured
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            outs: dict[tuple[str, str], Path] = {}
            for dataset in DATASETS:
                for side in order:
                    out = (
                        root
                        / f"{side}-{dataset}-{round_}"
                        / ("part.parquet" if side == "polars" else "")
                    )
                    out.parent.mkdir(parents=True, exist_ok=True)
                    cost = timed(lambda s=side, d=dataset, o=out: sides[s](logs_path, d, o))
                    outs[(side, dataset)] = out
                    if round_ or not args.repeat:  # --repeat 0: the warm-up round is reported
                        costs.setdefault((side, dataset), []).append(cost)
            problems = []
            for dataset in DATASETS:
                problems += check(
                    dataset, outs[("Spark", dataset)], outs[("polars", dataset)], expected
                )
                out_rows[dataset] = pq.read_metadata(outs[("polars", dataset)]).num_rows
            if problems:
                print("refusing to print figures: " + "; ".join(problems), file=sys.stderr)
                return 1
            for path in outs.values():  # keep the disk small between rounds
                target = path if path.is_dir() else path.parent
                for f in sorted(target.rglob("*"), reverse=True):
                    f.unlink() if f.is_file() else f.rmdir()
        if args.profile:
            profile(spark, logs_path, root / "profile", args.repeat)
        conf = spark.sparkContext.getConf()
        settings = {
            k: conf.get(k)
            for k in (
                "spark.master",
                "spark.sql.shuffle.partitions",
                "spark.sql.ansi.enabled",
                "spark.driver.extraJavaOptions",
                "spark.driver.memory",
            )
        }
        settings["spark.sql.files.maxPartitionBytes"] = spark.conf.get(
            "spark.sql.files.maxPartitionBytes"
        )
        settings["spark.version"] = spark.version
    tspark.stop_spark()
    report(args, rows, meta.num_row_groups, costs, out_rows, expected, settings, pl)
    return 0


def report(
    args: Any,
    rows: int,
    row_groups: int,
    costs: dict[tuple[str, str], list[Cost]],
    out_rows: dict[str, int],
    expected: Expected,
    settings: dict[str, str],
    pl: Any,
) -> None:
    print(
        f"\n{rows:,} Cryo-schema log rows in, one Parquet file ({row_groups} row group(s), zstd); "
        f"median of {args.repeat} rounds after a warm-up one; read -> decode -> write "
        f"Parquet ({COMPRESSION}) per dataset"
    )
    jit = JIT_OPTIONS if JIT_OPTIONS in settings["spark.driver.extraJavaOptions"] else "absent"
    print(
        f"Spark: {settings['spark.version']}, master {settings['spark.master']}, shuffle "
        f"partitions {settings['spark.sql.shuffle.partitions']}, ANSI "
        f"{settings['spark.sql.ansi.enabled']}, JIT option {jit}, "
        f"driver {settings['spark.driver.memory']}, maxPartitionBytes "
        f"{settings['spark.sql.files.maxPartitionBytes']}"
    )
    print(
        f"polars: {pl.__version__}, {pl.thread_pool_size()} threads; machine: "
        f"{os.cpu_count()} cores"
    )
    print(
        f"checked on every round: same rows and columns on both sides, and every amount (Python "
        f"int) equal to the one made: {coverage(expected)}"
    )
    head = f"{'dataset':<17}{'rows out':>9}  {'Spark rows/s':>12}{'polars rows/s':>14}{'Spark/polars':>13}"
    print(head + f"  {'wall: Spark':>11}{'polars':>8}  {'CPU: Spark':>10}{'polars':>8}")
    total = {side: [0.0, 0.0] for side in ("Spark", "polars")}
    for dataset in DATASETS:
        med = {}
        for side in ("Spark", "polars"):
            med[side] = [statistics.median(c[i] for c in costs[(side, dataset)]) for i in (0, 1)]
            total[side][0] += med[side][0]
            total[side][1] += med[side][1]
        print(line(dataset, out_rows[dataset], rows, med))
    print(
        line("both", sum(out_rows.values()), rows, total) + "   (target: Spark >= 200,000 rows/s)"
    )


def line(name: str, out: int, rows: int, med: dict[str, list[float]]) -> str:
    s, p = rows / med["Spark"][0], rows / med["polars"][0]
    return (
        f"{name:<17}{out:>9,}  {s:>12,.0f}{p:>14,.0f}{s / p:>12.2f}x"
        f"  {med['Spark'][0]:>10.2f}s{med['polars'][0]:>7.2f}s"
        f"  {med['Spark'][1]:>9.2f}s{med['polars'][1]:>7.2f}s"
    )


if __name__ == "__main__":
    smoke.main(main)
