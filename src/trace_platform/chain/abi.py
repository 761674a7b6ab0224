"""Keccak and the static-type ABI pieces: selectors, event topics, 32-byte words, calldata."""

from __future__ import annotations

from Crypto.Hash import keccak


def keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def selector(signature: str) -> str:
    return "0x" + keccak256(signature.encode()).hex()[:8]


def topic0(signature: str) -> str:
    return "0x" + keccak256(signature.encode()).hex()


def word(value: int | str) -> str:
    """One 32-byte ABI word: an address (0x…) or an unsigned integer."""
    if isinstance(value, str):
        return value.lower().removeprefix("0x").rjust(64, "0")
    if value < 0:
        raise ValueError("only unsigned integers are encoded here")
    return f"{value:064x}"


def calldata(signature: str, *args: int | str) -> str:
    return selector(signature) + "".join(word(a) for a in args)
