"""`trace verify`: the published analytics checked against the chain itself at sampled blocks.

Modules, in the order a run uses them: `target` (which node and token: flags, the running
devnet, the last demo run), `sampling` (which blocks: spread over the synced range, its ends
always), `node` (the node's views at a block: `totalSupply()`, `balanceOf()`,
`validatorStake()`, batched), `checks` (each analytic through the Query Service against the
node, as pure-ish functions of a query callable and a node), `model` (what a check found)."""

from trace_platform.verify.checks import Query, verify_all
from trace_platform.verify.model import CannotVerify, Mismatch, Outcome
from trace_platform.verify.node import Node
from trace_platform.verify.sampling import sample_blocks
from trace_platform.verify.target import Target, TargetError, connect, resolve_target

__all__ = [
    "CannotVerify",
    "Mismatch",
    "Node",
    "Outcome",
    "Query",
    "Target",
    "TargetError",
    "connect",
    "resolve_target",
    "sample_blocks",
    "verify_all",
]
