"""The decode's per-row work on whole Arrow batches (numpy; for `mapInArrow`): 32-byte ABI words
into amount limbs (`trace_platform.spark.u256`'s LIMBS: nine BIGINTs base 10^9, floor form)
and binary into `0x` + lowercase hex text, exactly as the Spark SQL they replace.

Why: in Spark SQL these were the decode's main cost (`lower` of `hex` text, `conv` of hex
substrings, the limb sums), per row and allocating at each step; here each is a few vector
operations per batch. This module imports only numpy and pyarrow, so the Python workers that
run it (on the executors) start fast.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# u256's limbs (tests/unit/test_words.py checks they are the same).
BASE = 10**9
TOP = 8
FIELDS = [f"l{k}" for k in range(TOP, -1, -1)]  # high to low, as the struct holds them
WORD = 32

# The limbs (l0..l8) of each 16-bit part's weight, 2^240 down to 1: a part is below 2^16 and a
# limb below 10^9, so the sixteen products of a limb add up below 2^50 (no int64 overflow).
_WEIGHTS = np.array(
    [[(2 ** (16 * (15 - i)) // BASE**k) % BASE for k in range(TOP + 1)] for i in range(16)],
    dtype=np.int64,
)
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
# Each byte's two lowercase hex digits, as one little-endian uint16 (high nibble first in memory).
_HEX_PAIRS = (_HEX[np.arange(256) >> 4].astype(np.uint16)) | (
    _HEX[np.arange(256) & 15].astype(np.uint16) << 8
)
_PREFIX = np.frombuffer(b"0x", dtype=np.uint8)


def _binary(arr: pa.Array) -> pa.Array:
    return arr.cast(pa.binary()) if arr.type != pa.binary() else arr


def _values(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary array's offsets (from 0) and its bytes."""
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    data = arr.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.empty(0, np.uint8)
    return offsets - offsets[0], raw[offsets[0] : offsets[-1]]


def words_matrix(words: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """32-byte words as an (n, 16) int64 matrix of their big-endian 16-bit parts (a NULL as
    zeros), and where they are valid (None: all are). Any other length is a ValueError: the
    callers check lengths first (a short word is an error naming its log, raised by Spark)."""
    words = _binary(words)
    valid = None
    if words.null_count:
        valid = words.is_valid().to_numpy(zero_copy_only=False)
        words = words.fill_null(b"\0" * WORD)
    offsets, data = _values(words)
    if len(data) != WORD * len(words) or np.any(np.diff(offsets) != WORD):
        raise ValueError("an amount word is not 32 bytes")
    return data.view(">u2").reshape(len(words), 16).astype(np.int64), valid


def limbs_of_words(parts: np.ndarray) -> np.ndarray:
    """(n, 16) word parts -> (n, 9) limbs l0..l8 in floor form: each limb's sum of the parts
    times their weights' limbs, carried (u256.word_limbs' arithmetic, in numpy)."""
    sums = parts @ _WEIGHTS
    out = np.empty_like(sums)
    carried = sums[:, 0]
    for k in range(TOP):
        if k:
            carried = sums[:, k] + carried // BASE
        out[:, k] = carried % BASE
    out[:, TOP] = sums[:, TOP] + carried // BASE
    return out


def negate(limbs: np.ndarray) -> np.ndarray:
    """-x in floor form (u256.NEG): subtract from 0 with a borrow, limb by limb."""
    out = np.empty_like(limbs)
    borrow = np.zeros(len(limbs), dtype=np.int64)
    for k in range(TOP):
        d = -limbs[:, k] - borrow
        below = d < 0
        out[:, k] = np.where(below, d + BASE, d)
        borrow = below.astype(np.int64)
    out[:, TOP] = -limbs[:, TOP] - borrow
    return out


def limbs_array(limbs: np.ndarray, valid: np.ndarray | None) -> pa.StructArray:
    """(n, 9) limbs l0..l8 as the LIMBS struct (fields l8..l0), NULL where not `valid`."""
    children = [pa.array(np.ascontiguousarray(limbs[:, k])) for k in range(TOP, -1, -1)]
    mask = None if valid is None else pa.array(~valid)
    return pa.StructArray.from_arrays(children, names=FIELDS, mask=mask)


def word_limbs(words: pa.Array) -> pa.StructArray:
    """Each 32-byte word (big-endian uint256) as limbs; NULL stays NULL."""
    parts, valid = words_matrix(words)
    return limbs_array(limbs_of_words(parts), valid)


def hex_text(arr: pa.Array, start: int = 0, length: int | None = None) -> pa.StringArray:
    """`concat('0x', lower(hex(substring(arr, start + 1, length))))` in Spark's terms: the bytes
    from `start` (at most `length` of them; fewer, or none, if the value is shorter) as `0x` and
    lowercase hex; NULL stays NULL."""
    arr = _binary(arr)
    if start or length is not None:
        stop = None if length is None else start + length
        arr = _binary(pc.binary_slice(arr, start, stop))
    n = len(arr)
    offsets, data = _values(arr)
    digits = _HEX_PAIRS[data].view(np.uint8)
    sizes = np.diff(offsets)
    if n and np.all(sizes == sizes[0]):  # the usual case: every value the same size
        text = np.empty((n, 2 + 2 * int(sizes[0])), dtype=np.uint8)
        text[:, :2] = _PREFIX
        text[:, 2:] = digits.reshape(n, -1)
        out_offsets = np.arange(n + 1, dtype=np.int32) * text.shape[1]
        text = text.reshape(-1)
    else:
        out_offsets = (2 * offsets + 2 * np.arange(n + 1)).astype(np.int32)
        text = np.empty(int(out_offsets[-1]), dtype=np.uint8)
        prefix = np.zeros(len(text), dtype=bool)
        prefix[out_offsets[:-1]] = True
        prefix[out_offsets[:-1] + 1] = True
        text[prefix] = np.tile(_PREFIX, n)
        text[~prefix] = digits
    validity = None
    if arr.null_count:
        validity = pa.array(arr.is_valid().to_numpy(zero_copy_only=False)).buffers()[1]
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(out_offsets), pa.py_buffer(text), validity, arr.null_count
    )


# --- the decode operators' batch functions (trace_platform.operators.decode) -------------------


def transfers_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Filtered Transfer logs (block_number, transaction_hash, log_index, address, topic1,
    topic2, data: a 32-byte word) -> erc20_transfers rows."""
    for b in batches:
        yield pa.RecordBatch.from_arrays(
            [
                b.column("block_number"),
                hex_text(b.column("transaction_hash")),
                b.column("log_index"),
                hex_text(b.column("address")),
                hex_text(b.column("topic1"), 12, 20),  # an address topic: its low 20 bytes
                hex_text(b.column("topic2"), 12, 20),
                word_limbs(b.column("data")),
            ],
            names=TRANSFER_COLUMNS,
        )


TRANSFER_COLUMNS = [
    "block_number",
    "tx_hash",
    "log_index",
    "token_address",
    "from_address",
    "to_address",
    "value",
]
STAKING_COLUMNS = [
    "block_number",
    "tx_hash",
    "log_index",
    "event",
    "validator_id",
    "delegator",
    "epoch",
    "amount_delta",
]


def staking_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Staking logs with their event, validator_id and epoch decoded, and `amount_word` (the
    32-byte amount of a Delegate or Undelegate, checked; NULL for other events) -> staking_events
    rows: amount_delta is the amount, negated for Undelegate, 0 for the other events."""
    for b in batches:
        event = b.column("event")
        parts, valid = words_matrix(b.column("amount_word"))
        limbs = limbs_of_words(parts)
        undelegate = pc.fill_null(pc.equal(event, "Undelegate"), False).to_numpy(
            zero_copy_only=False
        )
        if undelegate.any():
            limbs = np.where(undelegate[:, None], negate(limbs), limbs)
        if valid is not None:  # other events have no word and a 0 delta, not a NULL one
            moves = pc.is_in(event, pa.array(["Delegate", "Undelegate"])).to_numpy(
                zero_copy_only=False
            )
            valid = valid | ~moves
        epoch_changed = pc.fill_null(pc.equal(event, "EpochChanged"), False)
        delegator = pc.if_else(
            epoch_changed, pa.scalar(None, pa.string()), hex_text(b.column("topic2"), 12, 20)
        )
        yield pa.RecordBatch.from_arrays(
            [
                b.column("block_number"),
                hex_text(b.column("transaction_hash")),
                b.column("log_index"),
                event,
                b.column("validator_id"),
                delegator,
                b.column("epoch"),
                limbs_array(limbs, valid),
            ],
            names=STAKING_COLUMNS,
        )
