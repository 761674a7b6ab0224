"""Exact amounts end to end on the real parts: logs with 2^200, 2^255, 2^256-1 and amounts
around 10^38 through the real decode operators (Spark), the demo DAG's analytics through
sql_transform, then the Query Service (DuckDB over the files Spark wrote): every number equals
Python's integer arithmetic, in JSON, CSV and Parquet."""

from __future__ import annotations

import io
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import trace_platform.spark as tspark
from tests.support.amounts import ARROW_LIMBS, limbs, value
from tests.support.dags import admin
from tests.support.datasets import commit_parquet
from tests.support.operators import put_table, read_output, run_operator
from trace_platform.chain import topic0
from trace_platform.contract import RangeSpec
from trace_platform.devnet.big_token import HOLDERS, LINE, MAX, SCRIPT, replay
from trace_platform.objectstore.local import LocalStore
from trace_platform.operators.context import PermanentError
from trace_platform.operators.decode import decode_erc20_transfers, decode_staking_events
from trace_platform.operators.sql_transform import sql_transform
from trace_platform.query import formats, saved
from trace_platform.services import Services
from trace_platform.spark.sql_guard import check_query

pytest.importorskip("pyspark")

DEMO = Path(__file__).resolve().parents[2] / "examples" / "dags" / "monad_demo.yaml"
ZERO = "0x" + "00" * 20
BIG = "0x" + "b1" * 20  # runs the devnet's large-amount script
SMALL = "0x" + "5a" * 20  # ordinary amounts
PEOPLE = ["0x" + f"{i:02x}" * 20 for i in range(1, HOLDERS + 3)]
STAKING = "0x" + "00" * 18 + "1000"
TRANSFER = bytes.fromhex(topic0("Transfer(address,address,uint256)")[2:])
DELEGATE = bytes.fromhex(topic0("Delegate(uint64,address,uint256,uint64)")[2:])
UNDELEGATE = bytes.fromhex(topic0("Undelegate(uint64,address,uint8,uint256,uint64)")[2:])
BLOCKS = 200
WINDOW = 25


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """The run's one Spark JVM (started here if no test before started it; left running)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    yield tspark.get_spark()


def _word(n: int) -> bytes:
    return n.to_bytes(32, "big")


def _addr(a: str) -> bytes:
    return b"\x00" * 12 + bytes.fromhex(a[2:])


Transfer = tuple[int, int, str, str, str, int]  # block, log_index, token, from, to, value


def transfers() -> list[Transfer]:
    """The devnet's large-amount script (one step a block) and seeded ordinary transfers."""
    out: list[Transfer] = []
    holders = PEOPLE[:HOLDERS]
    for i, s in enumerate(SCRIPT):
        src = ZERO if s.src is None else holders[s.src]
        dst = ZERO if s.dst is None else holders[s.dst]
        out.append((5 + 7 * i, 0, BIG, src, dst, s.amount))
    rnd = random.Random(3)
    for n in range(150):
        kind = rnd.random()
        src = ZERO if kind < 0.3 else rnd.choice(PEOPLE)
        dst = ZERO if 0.3 <= kind < 0.4 else rnd.choice(PEOPLE)
        out.append((rnd.randrange(BLOCKS), 1 + n, SMALL, src, dst, rnd.randrange(1, 10**22)))
    return out


Stake = tuple[int, int, str, int, int]  # block, log_index, kind, validator, amount


def stakes() -> list[Stake]:
    """Delegations past uint256 in sum (two of 2^255 and one of 2^200 on validator 1), around
    10^38, and undelegations."""
    return [
        (3, 0, "Delegate", 1, 2**255),
        (4, 0, "Delegate", 2, LINE - 1),
        (30, 0, "Delegate", 1, 2**255),
        (31, 0, "Delegate", 2, 2),  # validator 2 crosses 10^38
        (60, 0, "Undelegate", 2, LINE + 1),  # and falls to 0
        (61, 0, "Delegate", 3, MAX),
        (90, 0, "Delegate", 1, 2**200),
        (120, 0, "Undelegate", 3, MAX - 10**30),
        (150, 0, "Delegate", 4, 12345),
    ]


def log_table(rows: list[dict[str, Any]]) -> pa.Table:
    cols = ["topic1", "topic2", "topic3"]
    return pa.table(
        {
            "block_number": pa.array([r["block"] for r in rows], pa.int64()),
            "transaction_hash": pa.array(
                [(r["block"] * 1000 + r["log_index"]).to_bytes(32, "big") for r in rows]
            ),
            "log_index": pa.array([r["log_index"] for r in rows], pa.int32()),
            "address": pa.array([bytes.fromhex(r["address"][2:]) for r in rows]),
            "topic0": pa.array([r["topic0"] for r in rows]),
            **{c: pa.array([r.get(c) for r in rows], pa.binary()) for c in cols},
            "data": pa.array([r["data"] for r in rows]),
        }
    )


def transfer_logs(ts: list[Transfer]) -> pa.Table:
    return log_table(
        [
            {
                "block": b,
                "log_index": li,
                "address": token,
                "topic0": TRANSFER,
                "topic1": _addr(src),
                "topic2": _addr(dst),
                "data": _word(v),
            }
            for b, li, token, src, dst, v in ts
        ]
    )


def staking_logs(ss: list[Stake], truncated: bool = False) -> pa.Table:
    rows = []
    for b, li, kind, validator, amount in ss:
        data = (
            _word(amount) + _word(7) if kind == "Delegate" else _word(0) + _word(amount) + _word(7)
        )
        if truncated:
            data = data[:20]
        rows.append(
            {
                "block": b,
                "log_index": li,
                "address": STAKING,
                "topic0": DELEGATE if kind == "Delegate" else UNDELEGATE,
                "topic1": _word(validator),
                "topic2": _addr(PEOPLE[validator]),
                "data": data,
            }
        )
    return log_table(rows)


def supply_after_mints_and_burns() -> dict[int, int]:
    """The large-amount token's supply after each mint and burn, by block (replay(): the
    contract's arithmetic)."""
    steps = zip(SCRIPT, replay()[1], strict=True)
    return {5 + 7 * i: s for i, (step, s) in enumerate(steps) if step.kind != "transfer"}


def demo_sql(job: str) -> tuple[str, dict[str, Any] | None]:
    cfg = yaml.safe_load(DEMO.read_text())["jobs"][job]["config"]
    return cfg["sql"], cfg.get("args")


@pytest.fixture(scope="module")
def pipeline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, pa.Table]:
    """Logs -> decode -> the demo analytics, each step the real operator; every output as
    committed (Arrow tables, Spark's schema metadata kept)."""
    root = tmp_path_factory.mktemp("amounts")
    store = LocalStore(root / "store")
    rng = RangeSpec(start=0, end=BLOCKS)
    logs = put_table(store, "in/logs/", transfer_logs(transfers()))
    slogs = put_table(store, "in/slogs/", staking_logs(stakes()))
    work = root / "work"
    _, tr = run_operator(decode_erc20_transfers, store, work, [("logs", logs)], "out/tr/", rng=rng)
    _, st_ = run_operator(decode_staking_events, store, work, [("logs", slogs)], "out/st/", rng=rng)
    out = {"erc20_transfers": read_output(store, tr), "staking_events": read_output(store, st_)}
    inputs = {"erc20_transfers": tr, "staking_events": st_}
    for job, reads in (
        ("token_supply", ["erc20_transfers"]),
        ("token_balances", ["erc20_transfers"]),
        ("staking_periods", ["staking_events"]),
        ("validator_stake", ["staking_events", "staking_periods"]),
        ("staking_concentration", ["validator_stake"]),
        ("delegator_stake", ["staking_events", "staking_periods"]),
        ("delegator_concentration", ["delegator_stake"]),
    ):
        out[job], inputs[job] = run_demo_job(store, work, job, inputs, reads, rng)
    return out


def run_demo_job(
    store: LocalStore,
    work: Path,
    job: str,
    inputs: dict[str, str],
    reads: list[str],
    synced: RangeSpec,
    window: int = WINDOW,
) -> tuple[pa.Table, str]:
    """One of the demo DAG's analytics through sql_transform, its inputs committed as the
    synced range `synced` (as decode commits them)."""
    sql, args = demo_sql(job)
    args = {"window_blocks": window} if args else None  # as the golden path sets it
    _, loc = run_operator(
        sql_transform,
        store,
        work,
        [(name, inputs[name]) for name in reads],
        f"out/{job}/",
        {"sql": sql, "args": args},
        input_range=synced,
    )
    return read_output(store, loc), loc


def amounts(table: pa.Table) -> set[str]:
    """The columns stored as amounts (the limbs struct)."""
    return {f.name for f in table.schema if f.type == ARROW_LIMBS}


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows with every amount as a Python int."""
    exact = amounts(table)
    return [{k: value(v) if k in exact else v for k, v in r.items()} for r in table.to_pylist()]


def test_each_decoded_file_is_in_block_and_log_order(spark: Any, tmp_path: Path) -> None:
    """Logs out of order, over three input files: every file the decode commits holds its rows
    sorted by (block_number, log_index), and no row is lost or made twice."""
    store = LocalStore(tmp_path / "store")
    ts = transfers()
    random.Random(5).shuffle(ts)
    for i in range(3):
        buf = io.BytesIO()
        pq.write_table(transfer_logs(ts[i::3]), buf)
        store.put(f"in/logs/part-{i:05d}.parquet", buf.getvalue())
    _, loc = run_operator(
        decode_erc20_transfers,
        store,
        tmp_path / "work",
        [("logs", "in/logs/")],
        "out/tr/",
        rng=RangeSpec(start=0, end=BLOCKS),
    )
    files = sorted((store.root / loc).glob("*.parquet"))
    keys = []
    for f in files:
        t = pq.read_table(f, columns=["block_number", "log_index"])
        rows = list(zip(t["block_number"].to_pylist(), t["log_index"].to_pylist(), strict=True))
        assert rows == sorted(rows), f"{f.name} is not in block and log order"
        keys += rows
    assert sorted(keys) == sorted((b, li) for b, li, *_ in ts)


def test_decode_keeps_every_uint256_exact(pipeline: dict[str, pa.Table]) -> None:
    t = pipeline["erc20_transfers"]
    assert "value_overflow" not in t.column_names and "value_text" not in t.column_names
    got = sorted((r["block_number"], r["log_index"], r["value"]) for r in _rows(t))
    assert got == sorted((b, li, v) for b, li, _, _, _, v in transfers())
    assert {2**200, 2**255, MAX, LINE - 1, LINE + 1, LINE} <= {r["value"] for r in _rows(t)}
    for r in t.column("value").to_pylist():  # floor form, every limb in range
        assert r == limbs(value(r))
    assert amounts(t) == {"value"} and amounts(pipeline["staking_events"]) == {"amount_delta"}
    assert amounts(pipeline["token_supply"]) == {"supply_delta", "total_supply"}
    assert amounts(pipeline["token_balances"]) == {"delta", "balance"}
    s = {
        (r["block_number"], r["event"]): r["amount_delta"]
        for r in _rows(pipeline["staking_events"])
    }
    assert s[(3, "Delegate")] == 2**255 and s[(60, "Undelegate")] == -(LINE + 1)


def test_token_supply_and_balances_are_exact(pipeline: dict[str, pa.Table]) -> None:
    ts = transfers()
    for token in (BIG, SMALL):
        deltas: dict[int, int] = {}
        for b, _, tok, src, dst, v in ts:
            if tok == token and (src == ZERO or dst == ZERO):
                deltas[b] = deltas.get(b, 0) + (v if src == ZERO else -v)
        want, total = [], 0
        for b in sorted(deltas):
            total += deltas[b]
            want.append((b, deltas[b], total))
        got = [
            (r["block_number"], r["supply_delta"], r["total_supply"])
            for r in _rows(pipeline["token_supply"])
            if r["token_address"] == token
        ]
        assert got == want, token
    # The large-amount token's supply after each mint and burn is the contract's (replay()).
    big = [r["total_supply"] for r in _rows(pipeline["token_supply"]) if r["token_address"] == BIG]
    assert big == list(supply_after_mints_and_burns().values()) and max(big) == MAX
    balances: dict[tuple[str, str, int], int] = {}
    for b, _, tok, src, dst, v in ts:
        for account, d in ((src, -v), (dst, v)):
            if account != ZERO:
                balances[(tok, account, b)] = balances.get((tok, account, b), 0) + d
    running: dict[tuple[str, str], int] = {}
    want_b = []
    for tok, account, b in sorted(balances):
        running[(tok, account)] = running.get((tok, account), 0) + balances[(tok, account, b)]
        want_b.append((tok, account, b, balances[(tok, account, b)], running[(tok, account)]))
    got_b = [
        (r["token_address"], r["account"], r["block_number"], r["delta"], r["balance"])
        for r in _rows(pipeline["token_balances"])
    ]
    assert got_b == want_b
    final = {a: r for (t, a), r in running.items() if t == BIG}
    assert [final.get(h, 0) for h in PEOPLE[:HOLDERS]] == replay()[0]


def test_validator_stake_and_concentration_are_exact(pipeline: dict[str, pa.Table]) -> None:
    ss = stakes()
    validators = sorted({v for _, _, _, v, _ in ss})
    want: dict[tuple[int, int], int] = {}
    for w in range(BLOCKS // WINDOW):  # windows over the synced blocks 0 .. BLOCKS - 1
        for v in validators:
            want[((w + 1) * WINDOW - 1, v)] = sum(
                a if kind == "Delegate" else -a
                for b, _, kind, vv, a in ss
                if vv == v and b // WINDOW <= w
            )
    rows = _rows(pipeline["validator_stake"])
    assert {(r["window_end"], r["validator_id"]): r["stake"] for r in rows} == want
    assert max(want.values()) == 2 * 2**255 + 2**200  # past uint256: sums stay exact
    for r in rows:  # ranks by the exact number (ties share a rank)
        peers = [s for (end, _), s in want.items() if end == r["window_end"]]
        assert r["stake_rank"] == 1 + sum(s > r["stake"] for s in peers)
    conc = {r["window_end"]: r["total_stake"] for r in _rows(pipeline["staking_concentration"])}
    totals: dict[int, int] = {}
    for (end, _), s in want.items():
        if s > 0:
            totals[end] = totals.get(end, 0) + s
    assert conc == totals


# --- epochs, clipping and delegators -----------------------------------------------------------

EPOCH_CHANGED = bytes.fromhex(topic0("EpochChanged(uint64,uint64)")[2:])
EPOCHS = {40: 6, 95: 7, 150: 8}  # block of EpochChanged -> the epoch it starts (5 before)
SYNCED = RangeSpec(start=0, end=173)  # blocks 0 .. 172: not a multiple of any window
A, B, C = PEOPLE[0], PEOPLE[1], PEOPLE[2]
Delegation = tuple[int, int, str, int, str, int]  # block, log_index, kind, validator, who, amount


def delegations() -> list[Delegation]:
    """Several delegators per validator, amounts past 10^38 and uint256 sums; a delegation in
    the block of an epoch change (it counts in the new epoch); a full undelegation."""
    return [
        (3, 0, "Delegate", 1, A, 2**255),
        (10, 0, "Delegate", 1, B, 10),
        (12, 0, "Delegate", 2, A, LINE + 1),
        (50, 0, "Delegate", 1, C, 2**255),
        (95, 1, "Delegate", 1, B, LINE),
        (96, 0, "Delegate", 2, C, MAX),
        (120, 0, "Undelegate", 1, A, 2**255),
        (160, 0, "Delegate", 2, B, 7),
    ]


def epoch_logs(
    changes: list[tuple[int, int, int]] | None = None, moves: list[Delegation] | None = None
) -> pa.Table:
    """Staking logs: EpochChanged (block, log_index, new epoch) and (un)delegations."""
    if changes is None:
        changes = [(b, 0, e) for b, e in EPOCHS.items()]
    rows = [
        {
            "block": b,
            "log_index": li,
            "address": STAKING,
            "topic0": EPOCH_CHANGED,
            "data": _word(e - 1) + _word(e),
        }
        for b, li, e in changes
    ]
    for b, li, kind, validator, who, amount in delegations() if moves is None else moves:
        data = _word(amount) + _word(7) if kind == "Delegate" else _word(0) + _word(amount)
        rows.append(
            {
                "block": b,
                "log_index": li,
                "address": STAKING,
                "topic0": DELEGATE if kind == "Delegate" else UNDELEGATE,
                "topic1": _word(validator),
                "topic2": _addr(who),
                "data": data + (b"" if kind == "Delegate" else _word(7)),
            }
        )
    return log_table(sorted(rows, key=lambda r: (r["block"], r["log_index"])))


@pytest.fixture(scope="module")
def epochs(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, pa.Table]:
    root = tmp_path_factory.mktemp("epochs")
    store = LocalStore(root / "store")
    work = root / "work"
    logs = put_table(store, "in/logs/", epoch_logs())
    _, loc = run_operator(
        decode_staking_events, store, work, [("logs", logs)], "out/st/", rng=SYNCED
    )
    out, inputs = {}, {"staking_events": loc}
    for job, reads in (
        ("staking_periods", ["staking_events"]),
        ("validator_stake", ["staking_events", "staking_periods"]),
        ("staking_concentration", ["validator_stake"]),
        ("delegator_stake", ["staking_events", "staking_periods"]),
        ("delegator_concentration", ["delegator_stake"]),
    ):
        out[job], inputs[job] = run_demo_job(store, work, job, inputs, reads, SYNCED)
    return out


def periods() -> list[tuple[int, int, int]]:
    """(epoch, first block, last block) of every epoch within the synced blocks."""
    starts = [(5, SYNCED.start), *((e, b) for b, e in sorted(EPOCHS.items()))]
    ends = [b - 1 for _, b in starts[1:]] + [SYNCED.end - 1]
    return [(e, b, end) for (e, b), end in zip(starts, ends, strict=True)]


def stake_at(block: int) -> dict[tuple[int, str], int]:
    """Each (validator, delegator)'s stake after `block`."""
    out: dict[tuple[int, str], int] = {}
    for b, _, kind, v, who, amount in delegations():
        if b <= block:
            out[(v, who)] = out.get((v, who), 0) + (amount if kind == "Delegate" else -amount)
    return out


def test_periods_are_epochs_clipped_to_the_synced_blocks(epochs: dict[str, pa.Table]) -> None:
    got = [
        (r["epoch"], r["first_block"], r["last_block"]) for r in _rows(epochs["staking_periods"])
    ]
    assert got == periods() and got[-1][2] == SYNCED.end - 1  # never past the data
    stake = {(r["window_end"], r["validator_id"]): r for r in _rows(epochs["validator_stake"])}
    want = {}
    for epoch, first, last in periods():
        for v in (1, 2):
            total = sum(s for (vv, _), s in stake_at(last).items() if vv == v)
            want[(last, v)] = (epoch, first, total)
    assert {k: (r["epoch"], r["window_start"], r["stake"]) for k, r in stake.items()} == want
    conc = {
        r["window_end"]: (r["epoch"], r["validators"])
        for r in _rows(epochs["staking_concentration"])
    }
    assert conc == {last: (e, 1 if last < 12 else 2) for e, _, last in periods()}


def test_delegator_stake_and_concentration_per_validator(epochs: dict[str, pa.Table]) -> None:
    rows = _rows(epochs["delegator_stake"])
    got = {(r["window_end"], r["validator_id"], r["delegator"]): r["stake"] for r in rows}
    want = {
        (last, v, who): s
        for _, _, last in periods()
        for (v, who), s in stake_at(last).items()
        if s > 0  # A's full undelegation leaves no row
    }
    assert got == want
    conc = {
        (r["window_end"], r["validator_id"]): r for r in _rows(epochs["delegator_concentration"])
    }
    assert set(conc) == {(end, v) for end, v, _ in want}
    for (end, v), r in conc.items():
        held = {who: s for (e, vv, who), s in want.items() if (e, vv) == (end, v)}
        total = sum(held.values())
        top = max(held, key=lambda who: (held[who], who))
        assert (r["delegators"], r["total_stake"], r["top_delegator"]) == (len(held), total, top)
        assert r["top_delegator_share"] == pytest.approx(held[top] / total, rel=1e-9)
        assert r["hhi"] == pytest.approx(sum((s / total) ** 2 for s in held.values()), rel=1e-9)
        assert r["epoch"] == next(e for e, _, last in periods() if last == end)


def test_staking_edges_change_no_number_silently(spark: Any, tmp_path: Path) -> None:
    """Two epoch changes in one block; a delegation in that block; an undelegation whose
    delegation predates the synced blocks (a negative stake); three equal stakes (the Nakamoto
    coefficient at exactly a third); and a range decoded after the periods were cut (block
    150): none of them may move a number."""
    store = LocalStore(tmp_path / "store")
    work = tmp_path / "work"
    moves: list[Delegation] = [
        (10, 0, "Delegate", 1, A, 100),
        (50, 2, "Delegate", 2, B, 100),
        (80, 0, "Delegate", 3, C, 100),
        (90, 0, "Undelegate", 4, A, 30),
        (150, 0, "Delegate", 1, A, 10**6),
    ]
    logs = put_table(store, "in/logs/", epoch_logs([(50, 0, 6), (50, 1, 7)], moves))
    wide = RangeSpec(start=0, end=200)
    _, events = run_operator(
        decode_staking_events, store, work, [("logs", logs)], "out/st/", rng=wide
    )
    inputs = {"staking_events": events}
    # The periods were cut when blocks 0..99 were synced ...
    periods, inputs["staking_periods"] = run_demo_job(
        store, work, "staking_periods", inputs, ["staking_events"], RangeSpec(start=0, end=100)
    )
    got = [(r["epoch"], r["first_block"], r["last_block"]) for r in _rows(periods)]
    assert got == [(5, 0, 49), (7, 50, 99)]
    # ... and the stake is read once 0..199 are (the delegation at 150 waits for new periods).
    out = {}
    for job, reads in (
        ("validator_stake", ["staking_events", "staking_periods"]),
        ("staking_concentration", ["validator_stake"]),
    ):
        out[job], inputs[job] = run_demo_job(store, work, job, inputs, reads, wide)
    stake = {(r["window_end"], r["validator_id"]): r for r in _rows(out["validator_stake"])}
    assert {k: r["stake"] for k, r in stake.items()} == {
        (49, 1): 100, (49, 2): 0, (49, 3): 0, (49, 4): 0,
        (99, 1): 100, (99, 2): 100, (99, 3): 100, (99, 4): -30,
    }  # fmt: skip
    assert stake[(99, 4)]["share"] is None and stake[(49, 2)]["share"] is None
    assert stake[(99, 1)]["share"] == pytest.approx(1 / 3)  # of the positive stakes
    conc = {r["window_end"]: r for r in _rows(out["staking_concentration"])}
    assert (conc[99]["validators"], conc[99]["nakamoto_coefficient"]) == (3, 2)
    assert conc[99]["hhi"] == pytest.approx(1 / 3) and conc[49]["nakamoto_coefficient"] == 1


def test_a_short_staking_log_is_an_error_naming_it(spark: Any, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    logs = put_table(store, "in/slogs/", staking_logs(stakes()[:2], truncated=True))
    with pytest.raises(
        PermanentError,
        match=r"invalid amount in staking_events: Delegate log 0x0+bb8:0 has 20 data bytes",
    ):
        run_operator(
            decode_staking_events,
            store,
            tmp_path / "work",
            [("logs", logs)],
            "out/",
            rng=RangeSpec(start=0, end=BLOCKS),
        )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("1.5", r"1\.5"),
        # Java's `$` matches before a final line break: the digits would shift (10x).
        ("1000000000000000000\n", "1000000000000000000"),
        ("123456789012345678901234567890\r\n", "123456789012345678901234567890"),
        ("+5", r"\+5"),
        ("9" * 91, "9" * 91),  # past what the top limb holds: an error, not a wrong number
    ],
)
def test_text_that_is_not_an_integer_is_an_error_naming_it(
    spark: Any, tmp_path: Path, text: str, named: str
) -> None:
    """u256() reads decimal text; anything else stops the task (no NULL, no rounding)."""
    store = LocalStore(tmp_path / "store")
    raw = pa.table({"block_number": [1, 2], "amount": ["12", text]})
    put_table(store, "in/t/", raw)
    with pytest.raises(PermanentError, match=r"invalid amount in u256\(\): " + named):
        run_operator(
            sql_transform,
            store,
            tmp_path / "work",
            [("imported", "in/t/")],
            "out/",
            {"sql": "SELECT u256_sum(u256(amount)) AS total FROM imported"},
        )


def test_a_limb_sum_past_a_bigint_is_a_permanent_error(spark: Any, tmp_path: Path) -> None:
    """Ten 90-digit amounts: their top limbs' sum overflows a BIGINT (a sum past 91 digits; no
    uint256 sum gets near). ANSI mode (pinned) makes it an error, never a wrapped number, and a
    deterministic error fails the task without retries."""
    store = LocalStore(tmp_path / "store")
    put_table(store, "in/t/", pa.table({"amount": ["9" * 90] * 10}))
    with pytest.raises(PermanentError, match=r"invalid amount: .*ARITHMETIC_OVERFLOW"):
        run_operator(
            sql_transform,
            store,
            tmp_path / "work",
            [("imported", "in/t/")],
            "out/",
            {"sql": "SELECT u256_text(u256_sum(u256(amount))) AS total FROM imported"},
        )


# --- the limbs against Python's integers --------------------------------------------------

signed = st.integers(min_value=-MAX, max_value=MAX)
edges = st.sampled_from([0, 1, MAX, 2**255, 2**200, LINE - 1, LINE, LINE + 1, 10**9, 10**72])
value_lists = st.lists(st.one_of(signed, edges, edges.map(lambda x: -x)), min_size=1, max_size=60)
# Hypothesis's examples, all checked in one Spark job: each its own job was three queries, each
# planned and compiled again (the expanded helpers are large), some 2 CPU-s an example after the
# first; one job over all of them costs about what one example did, so more examples are checked
# (12 before). A failure names its example; tests/unit/test_u256_math.py shrinks the same
# properties against Python's integers in milliseconds.
EXAMPLES = 40


def drawn_examples(n: int) -> list[list[int]]:
    """`n` lists of amounts as hypothesis generates them (its simplest first, then its mix of
    edges, negated edges and random amounts in the whole signed range)."""
    drawn: list[list[int]] = []

    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate])
    @given(value_lists)
    def draw(values: list[int]) -> None:
        drawn.append(values)

    draw()
    return drawn


def test_limbs_sums_and_text_equal_python_integers(spark: Any) -> None:
    """Every helper on the real Spark against Python's integers: the text parse (u256), negation,
    sums (grouped and running), addition, text and the double; each example (`e`) is a group of
    its own, in four groups (`g`) of its values."""
    examples = drawn_examples(EXAMPLES)
    assert len(examples) == EXAMPLES, len(examples)
    s = tspark.task_session()
    try:
        rows = [(e, i % 4, i, str(v)) for e, vs in enumerate(examples) for i, v in enumerate(vs)]
        s.createDataFrame(rows, "e INT, g INT, i INT, t STRING").createOrReplaceTempView("raw")
        parsed = check_query("SELECT e, g, i, t, u256(t) AS v FROM raw", ["raw"]).sql
        s.sql(parsed).createOrReplaceTempView("t")
        back = {(r.e, r.i): (r.t, value(r.v)) for r in s.sql("SELECT * FROM t").collect()}
        sql = check_query(
            """SELECT e, g, u256_sum(v) AS total, u256_sum(u256_neg(v)) AS negated,
                      u256_add(max(v), min(v)) AS extremes, u256_text(u256_sum(v)) AS text,
                      u256_double(u256_sum(v)) AS approx, max(v) AS top, min(v) AS bottom
               FROM t GROUP BY e, g""",
            ["t"],
        ).sql
        got = {(r.e, r.g): r for r in s.sql(sql).collect()}
        window = check_query(
            "SELECT e, i, u256_sum(v) OVER (PARTITION BY e, g ORDER BY i) AS running FROM t",
            ["t"],
        ).sql
        running = {(r.e, r.i): value(r.running) for r in s.sql(window).collect()}
    finally:
        tspark.end_task(s)
    assert back == {(e, i): (str(v), v) for e, vs in enumerate(examples) for i, v in enumerate(vs)}
    for e, values in enumerate(examples):
        for g in {i % 4 for i in range(len(values))}:
            xs = [v for i, v in enumerate(values) if i % 4 == g]
            r = got[(e, g)]
            assert (value(r.total), value(r.negated), r.text) == (
                sum(xs),
                -sum(xs),
                str(sum(xs)),
            ), values
            assert (value(r.top), value(r.bottom)) == (max(xs), min(xs)), values  # struct order
            assert value(r.extremes) == max(xs) + min(xs), values
            assert r.approx == pytest.approx(float(sum(xs)), rel=1e-12, abs=1e-3), values
            for limbs_ in (r.total, r.negated, r.extremes):  # floor form
                assert limbs(value(limbs_)) == limbs_.asDict(), values
        for i, v in enumerate(values):
            prefix = [x for j, x in enumerate(values) if j % 4 == i % 4 and j <= i]
            assert running[(e, i)] == sum(prefix), (v, values)
    assert len(got) == sum(min(len(vs), 4) for vs in examples)


# --- the Query Service over the files Spark wrote ------------------------------------------

PUBLISH = """
name: amounts
jobs:
  src:
    operator: noop
    outputs: [{backend: parquet}, {backend: parquet}, {backend: parquet}, {backend: parquet}]
publish:
  - {job: src, output_index: 0, dataset: erc20_transfers}
  - {job: src, output_index: 1, dataset: token_supply}
  - {job: src, output_index: 2, dataset: token_balances}
  - {job: src, output_index: 3, dataset: blocks}
"""


@pytest.fixture
def published(services: Services, pipeline: dict[str, pa.Table]) -> Services:
    services.control.deploy(admin(services), PUBLISH)
    for name in ("erc20_transfers", "token_supply", "token_balances"):
        commit_parquet(services, name, pipeline[name], 0, BLOCKS)
    blocks = pa.table({"block_number": pa.array(range(BLOCKS), pa.int64())})
    commit_parquet(services, "blocks", blocks, 0, BLOCKS)
    return services


def test_the_query_service_reads_amounts_as_exact_numbers(published: Services) -> None:
    me = admin(published)
    values = [v for *_, v in transfers()]
    out = published.query.query(
        me,
        "SELECT sum(value) AS s, max(value) AS mx, min(value) AS mn, count(*) FROM erc20_transfers",
    ).as_json()
    assert [c["type"] for c in out["columns"][:3]] == ["bignum"] * 3
    assert out["rows"] == [[str(sum(values)), str(MAX), str(min(values)), len(values)]]
    assert sum(values) > MAX  # the sum itself is past uint256, and still exact
    # Numeric order, not text order (as text, "9" > "115…").
    top = published.query.query(
        me, "SELECT value FROM erc20_transfers ORDER BY value DESC LIMIT 4"
    ).as_json()["rows"]
    assert [int(r[0]) for r in top] == sorted(values, reverse=True)[:4]
    big = published.query.query(
        me,
        f"SELECT count(*) FROM erc20_transfers WHERE value >= {LINE} AND token_address = '{BIG}'",
    ).as_json()["rows"]
    assert big == [[sum(s.amount >= LINE for s in SCRIPT)]]


def test_saved_queries_answer_exactly_for_the_large_amount_token(published: Services) -> None:
    me = admin(published)
    q = saved.load("token_supply")
    rows = published.query.query(me, q.sql, q.params({"token": BIG})).as_json()["rows"]
    by_block = {b: int(s) for b, s in rows}
    assert len(by_block) == BLOCKS
    for i, want in enumerate(replay()[1]):  # carried forward over the transfers' blocks too
        assert by_block[5 + 7 * i] == want
    q = saved.load("top_holders")
    rows = published.query.query(me, q.sql, q.params({"token": BIG, "n": 4})).as_json()["rows"]
    final = replay()[0]
    want = sorted(((b, PEOPLE[i]) for i, b in enumerate(final) if b > 0), reverse=True)
    assert [(int(r[2]), r[1]) for r in rows] == want


def test_csv_and_parquet_results_carry_the_exact_digits(published: Services) -> None:
    me = admin(published)
    sql = f"SELECT block_number, total_supply FROM token_supply WHERE token_address = '{BIG}' ORDER BY 1"
    result = published.query.query(me, sql)
    want = [str(s) for s in supply_after_mints_and_burns().values()]
    back = pcsv.read_csv(
        io.BytesIO(formats.encode(result.table, "csv")),
        convert_options=pcsv.ConvertOptions(column_types={"total_supply": pa.string()}),
    )
    assert back.column("total_supply").to_pylist() == want
    assert str(MAX).encode() in formats.encode(result.table, "csv")
    parquet = pq.read_table(io.BytesIO(formats.encode(result.table, "parquet")))
    assert parquet.schema.field("total_supply").type == pa.string()
    assert parquet.column("total_supply").to_pylist() == want
    exported = published.query.export(me, sql, None, "parquet")
    assert exported["row_count"] == len(want)
