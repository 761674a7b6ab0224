"""What a check found: per analytic, how many values were compared and which did not match."""

from __future__ import annotations

from dataclasses import dataclass, field


class CannotVerify(RuntimeError):
    """Nothing to check, or nothing to check against: the message says what to do."""


@dataclass(frozen=True)
class Mismatch:
    analytic: str
    block: int
    subject: str  # what the value is of: the token, an account, a validator
    trace: int | None  # None: Trace has no value there at all
    node: int | None  # None: the node has nothing there (no contract at that block)

    def describe(self) -> str:
        shown = "missing" if self.trace is None else str(self.trace)
        node = "nothing" if self.node is None else str(self.node)
        return f"{self.analytic} at block {self.block} ({self.subject}): Trace {shown}, node {node}"


@dataclass
class Outcome:
    analytic: str
    compared: str  # what was compared with what, for the table
    blocks: list[int] = field(default_factory=list)
    checked: int = 0
    matched: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    skipped: str | None = None  # why this analytic was not checked

    def compare(self, block: int, subject: str, trace: int | None, node: int | None) -> None:
        self.checked += 1
        if trace is not None and trace == node:
            self.matched += 1
        else:
            self.mismatches.append(Mismatch(self.analytic, block, subject, trace, node))

    @property
    def ok(self) -> bool:
        return not self.mismatches
