"""Spark operators that decode raw logs into exact, typed datasets.

Amounts are exact for every uint256: `value` / `amount_delta` are limbs
(`trace_platform.spark.u256`), made from the 32-byte words on whole Arrow batches
(`trace_platform.spark.words`, numpy: no Python per row); the Query Service reads them as exact
numbers. Never a rounded float, never a NULL for a number too big: an amount word that is not a
whole uint256 fails the task, naming the log.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from trace_platform.chain import topic0
from trace_platform.contract import RangeSpec
from trace_platform.operators.config import OperatorConfig
from trace_platform.operators.context import OperatorContext, OperatorResult, PermanentError
from trace_platform.operators.inputs import read_frame, scope_location
from trace_platform.operators.output import publish_frame
from trace_platform.spark import u256, words

TRANSFER = topic0("Transfer(address,address,uint256)")
STAKING = {
    "ValidatorCreated": topic0("ValidatorCreated(uint64,address,uint256)"),
    "Delegate": topic0("Delegate(uint64,address,uint256,uint64)"),
    "Undelegate": topic0("Undelegate(uint64,address,uint8,uint256,uint64)"),
    "Withdraw": topic0("Withdraw(uint64,address,uint8,uint256,uint64)"),
    "ClaimRewards": topic0("ClaimRewards(uint64,address,uint256,uint64)"),
    "ValidatorRewarded": topic0("ValidatorRewarded(uint64,address,uint256,uint64)"),
    "EpochChanged": topic0("EpochChanged(uint64,uint64)"),
}
ORDER = ("block_number", "log_index")  # the rows' order in each of a decoded range's files
STAKING_ADDRESS = "0x0000000000000000000000000000000000001000"
ADDRESS_RE = r"^0x[0-9a-fA-F]{40}$"
# The datasets' schemas (the amounts as u256 limbs), as the Arrow batch functions return them.
TRANSFERS_SCHEMA = (
    "block_number BIGINT, tx_hash STRING, log_index INT, token_address STRING, "
    f"from_address STRING, to_address STRING, value {u256.LIMBS}"
)
STAKING_SCHEMA = (
    "block_number BIGINT, tx_hash STRING, log_index INT, event STRING, validator_id BIGINT, "
    f"delegator STRING, epoch BIGINT, amount_delta {u256.LIMBS}"
)


class Erc20TransfersConfig(OperatorConfig):
    token_address: str | None = Field(
        default=None, pattern=ADDRESS_RE, description="only this token's transfers"
    )


class StakingEventsConfig(OperatorConfig):
    staking_address: str = Field(
        default=STAKING_ADDRESS,
        pattern=ADDRESS_RE,
        description="the staking contract (Monad's precompile by default)",
    )


def _range(ctx: OperatorContext) -> tuple[int, int]:
    rng = (ctx.task.input_event or {}).get("range")
    if not rng:
        raise PermanentError(f"{ctx.task.operator} needs a range event from the ingest job")
    return int(rng["start"]), int(rng["end"])


def _read_logs(ctx: OperatorContext, start: int, end: int) -> Any:
    """The input range's committed Parquet files (that commit's own, not every attempt's under
    the range) as a DataFrame."""
    location = scope_location(ctx, ctx.task.inputs[0])
    if location is None:
        raise PermanentError(
            f"input 0 has no commit for blocks [{start}, {end}) in its pinned version"
        )
    frame = read_frame(ctx, [location])
    if frame is None:
        raise PermanentError(f"input 0's commit for blocks [{start}, {end}) holds no Parquet")
    return frame


def small_topic(col: str) -> Any:
    """A uint64 topic's value: its low 8 bytes (hex, any case: conv reads both) as a long."""
    from pyspark.sql import functions as F

    return F.conv(F.hex(F.substring(col, 25, 8)), 16, 10).cast("long")


def transfers_frame(logs: Any, token: str | None = None) -> Any:
    """Raw logs -> erc20_transfers rows (Transfer by topic0 with exactly three topics; ERC721's
    Transfer has four). `token` narrows to one token address."""
    from pyspark.sql import functions as F

    frame = logs.where(
        (F.col("topic0") == F.lit(bytes.fromhex(TRANSFER[2:])))
        & F.col("topic3").isNull()
        & (F.length("data") == 32)
    )
    if token:
        frame = frame.where(F.col("address") == F.lit(bytes.fromhex(token[2:])))
    # The hex text and the limbs are made on whole Arrow batches (spark/words.py): per row in
    # Spark SQL (lower(hex(...)), conv of hex substrings) they cost most of the decode.
    frame = frame.select(
        F.col("block_number").cast("long").alias("block_number"),
        "transaction_hash",
        F.col("log_index").cast("int").alias("log_index"),
        "address",
        "topic1",
        "topic2",
        "data",
    )
    # Each partition sorted before the Python step, which keeps row order: every part file is
    # in ORDER. Not a global orderBy: its range partitioner reads and filters the whole input
    # once more to sample it, then shuffles every row (a third of the decode's time), where a
    # range's raw logs already come in block order (Cryo writes them so), so each read split,
    # and the part file it becomes, holds its own span of blocks anyway.
    frame = frame.sortWithinPartitions(*ORDER)
    return frame.mapInArrow(words.transfers_batches, TRANSFERS_SCHEMA)


def decode_erc20_transfers(ctx: OperatorContext) -> OperatorResult:
    """logs -> erc20_transfers(block_number, tx_hash, log_index, token_address, from_address,
    to_address, value); config `token_address` narrows to one."""
    cfg = Erc20TransfersConfig.from_ctx(ctx)
    start, end = _range(ctx)
    logs = _read_logs(ctx, start, end)
    frame = transfers_frame(logs, cfg.token_address)
    with u256.invalid_amounts_fail():
        return publish_frame(ctx, frame, RangeSpec(start=start, end=end), order=ORDER)


def staking_frame(logs: Any, address: str = STAKING_ADDRESS) -> Any:
    """Raw logs -> staking_events rows: the logs of the staking contract at `address`."""
    from pyspark.sql import functions as F

    by_topic = {bytes.fromhex(v[2:]): k for k, v in STAKING.items()}
    t0 = F.col("topic0")  # binary against binary literals: no hex text per row
    event = F.coalesce(*[F.when(t0 == F.lit(h), F.lit(name)) for h, name in by_topic.items()])

    def small(i: int) -> Any:  # a uint64/uint8 word: its low 8 bytes (16 hex digits) fit a long
        return F.conv(F.hex(F.substring("data", i * 32 + 25, 8)), 16, 10).cast("long")

    amount_word = F.when(event == "Delegate", F.substring("data", 1, 32)).when(
        event == "Undelegate", F.substring("data", 33, 32)
    )
    # A log too short to hold its amount is an error naming it, never a NULL or a wrong number.
    short = F.raise_error(
        F.concat(
            F.lit(f"{u256.INVALID} in staking_events: "),
            event,
            F.lit(" log "),
            F.concat(F.lit("0x"), F.lower(F.hex("transaction_hash"))),
            F.lit(":"),
            F.col("log_index").cast("string"),
            F.lit(" has "),
            F.length("data").cast("string"),
            F.lit(" data bytes, no whole uint256 amount"),
        )
    )
    amount_word = F.when(amount_word.isNotNull() & (F.length(amount_word) != 32), short).otherwise(
        amount_word
    )
    frame = (
        logs.where(F.col("address") == F.lit(bytes.fromhex(address[2:])))
        .withColumn("event", event)
        .where(F.col("event").isNotNull())
        .select(
            F.col("block_number").cast("long").alias("block_number"),
            "transaction_hash",
            F.col("log_index").cast("int").alias("log_index"),
            F.col("event"),
            F.when(F.col("event") != "EpochChanged", small_topic("topic1")).alias("validator_id"),
            "topic2",
            amount_word.alias("amount_word"),
            F.when(F.col("event") == "Delegate", small(1))
            .when(F.col("event") == "Undelegate", small(2))
            .when(F.col("event") == "Withdraw", small(2))
            .when(F.col("event").isin("ClaimRewards", "ValidatorRewarded"), small(1))
            .when(F.col("event") == "EpochChanged", small(1))
            .alias("epoch"),
        )
    )
    # The hex text, and amount_delta from the checked word (the amount, negated for
    # Undelegate, 0 for other events), on whole Arrow batches (spark/words.py), after each
    # partition's sort (as in transfers_frame).
    frame = frame.sortWithinPartitions(*ORDER)
    return frame.mapInArrow(words.staking_batches, STAKING_SCHEMA)


def decode_staking_events(ctx: OperatorContext) -> OperatorResult:
    """logs of the staking contract -> staking_events(block_number, tx_hash, log_index, event,
    validator_id, delegator, amount_delta, epoch): Delegate adds stake, Undelegate removes it,
    other events carry amount_delta 0."""
    cfg = StakingEventsConfig.from_ctx(ctx)
    start, end = _range(ctx)
    logs = _read_logs(ctx, start, end)
    frame = staking_frame(logs, cfg.staking_address)
    with u256.invalid_amounts_fail():
        return publish_frame(ctx, frame, RangeSpec(start=start, end=end), order=ORDER)
