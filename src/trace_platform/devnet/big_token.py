"""The devnet's large-amount token: a second deployment of the same ERC20, driven by a fixed
script of mints, transfers and burns with amounts no DECIMAL(38,0) can hold (2^200, 2^255,
2^256-1) and amounts right at the 10^38 line, so the analytics are checked exactly where a
fixed-precision path would lose them.

The total supply must stay below 2^256 (the contract reverts on overflow), so the script mints
2^200 and 2^255, moves and burns parts across the 10^38 line, burns everything, then mints
2^256-1 (the largest supply there is) and moves and burns parts of that. `replay` checks every
step against balances and supply; the seed picks the holders, one step per scheduled block.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

MAX = 2**256 - 1
LINE = 10**38  # where DECIMAL(38,0) ends


@dataclass(frozen=True)
class Step:
    kind: str  # mint | transfer | burn
    src: int | None  # holder index (None for a mint)
    dst: int | None  # holder index (None for a burn)
    amount: int


SCRIPT: tuple[Step, ...] = (
    Step("mint", None, 0, 2**200),
    Step("mint", None, 1, LINE - 1),
    Step("transfer", 0, 1, LINE + 1),  # holder 1 crosses 10^38 upwards
    Step("transfer", 1, 2, LINE - 1),
    Step("burn", 1, None, LINE),  # and back below it
    Step("mint", None, 2, 2**255),
    Step("transfer", 2, 3, 2**254),
    Step("burn", 0, None, 2**200 - LINE - 1),  # from here on everything is burnt …
    Step("burn", 2, None, 2**254 + LINE - 1),
    Step("burn", 3, None, 2**254),
    Step("burn", 1, None, 1),
    Step("mint", None, 0, MAX),  # … so that 2^256-1 can be minted
    Step("transfer", 0, 1, 2**255),
    Step("transfer", 1, 2, LINE + 5),
    Step("burn", 0, None, 2**255 - 1 - 2**200),
    Step("burn", 2, None, LINE + 5),
)
HOLDERS = 4


def holders(seed: int) -> list[str]:
    return [
        "0x" + hashlib.sha256(f"trace-devnet:{seed}:big:{i}".encode()).hexdigest()[:40]
        for i in range(HOLDERS)
    ]


def schedule(first_block: int, last_block: int) -> dict[int, Step]:
    """One step per block, spread evenly over [first_block, last_block]; none on a chain too
    short for the whole script (the token is deployed all the same)."""
    span = last_block - first_block
    if span < len(SCRIPT):
        return {}
    gap = span // len(SCRIPT)
    return {first_block + i * gap: step for i, step in enumerate(SCRIPT)}


def replay(steps: tuple[Step, ...] = SCRIPT) -> tuple[list[int], list[int]]:
    """(balances after the last step, supply after each step); raises ValueError on a step the
    contract would revert (a balance below zero, a supply past 2^256-1)."""
    balances, supplies, supply = [0] * HOLDERS, [], 0
    for i, s in enumerate(steps):
        if s.src is not None:
            if balances[s.src] < s.amount:
                raise ValueError(f"step {i}: holder {s.src} has {balances[s.src]} < {s.amount}")
            balances[s.src] -= s.amount
        else:
            supply += s.amount
        if s.dst is not None:
            balances[s.dst] += s.amount
        else:
            supply -= s.amount
        if supply > MAX:
            raise ValueError(f"step {i}: supply {supply} > 2^256-1")
        supplies.append(supply)
    return balances, supplies
