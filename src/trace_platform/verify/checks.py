"""Each published analytic, read as a user reads it (saved queries through the Query Service,
as the acting user), against the node's own views at the same blocks.

A check takes a `Query` (SQL + parameters -> rows as dicts) and a `Node`, so it runs the same
in the CLI, in tests, or over HTTP. Amounts may arrive as exact JSON strings: read with
int(str(v)), never through a float."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trace_platform.chain import RpcError, calldata
from trace_platform.devnet.chain import STAKING_ADDRESS
from trace_platform.errors import NotFound
from trace_platform.query import saved
from trace_platform.verify.model import CannotVerify, Outcome
from trace_platform.verify.node import Node
from trace_platform.verify.sampling import sample_blocks, sample_of

Query = Callable[[str, dict[str, Any]], list[dict[str, Any]]]
STAKE_VIEW = "validatorStake(uint64)"


class Unpublished(Exception):
    """A dataset the check reads is not published (or not readable: the Query Service answers
    both alike)."""


def amount(v: Any) -> int | None:
    return None if v is None else int(str(v))


def run_saved(query: Query, name: str, where: str = "", **params: Any) -> list[dict[str, Any]]:
    """A saved query as `trace query --saved` runs it; `where` filters its rows (to the sampled
    blocks) without changing how it computes them."""
    q = saved.load(name)
    sql = q.sql.strip().rstrip(";")
    if where:
        sql = f"SELECT * FROM (\n{sql}\n) AS saved_query WHERE {where}"
    try:
        return query(sql, q.params(params))
    except NotFound as e:
        raise Unpublished(_unknown(e)) from None


def _unknown(e: NotFound) -> str:
    """The dataset names the Query Service could not find (or may not show)."""
    names = e.detail.get("unknown")
    return ", ".join(map(str, names)) if isinstance(names, list) else e.message


def synced_range(query: Query) -> tuple[int, int] | None:
    """The first and last block Trace holds (the `blocks` dataset: hot window + history)."""
    try:
        rows = query("SELECT min(block_number) AS lo, max(block_number) AS hi FROM blocks", {})
    except NotFound:
        return None
    lo, hi = rows[0]["lo"], rows[0]["hi"]
    return None if lo is None else (int(lo), int(hi))


def _in(blocks: list[int]) -> str:
    return f"block_number IN ({', '.join(str(int(b)) for b in blocks)})"


def check_supply(query: Query, node: Node, token: str, blocks: list[int]) -> Outcome:
    out = Outcome("token_supply", "total supply vs totalSupply()", blocks)
    try:
        rows = run_saved(query, "token_supply", _in(blocks), token=token)
    except Unpublished as e:
        out.skipped = f"not published ({e})"
        return out
    trace = {int(r["block_number"]): amount(r["total_supply"]) for r in rows}
    views = node.views([(token, calldata("totalSupply()"), b) for b in blocks])
    for b, view in zip(blocks, views, strict=True):
        out.compare(b, token, trace.get(b), view or 0)  # no token yet: no supply
    return out


def check_top_holders(query: Query, node: Node, token: str, head: int, n: int) -> Outcome:
    out = Outcome("top_holders", "balance at the synced head vs balanceOf()", [head])
    try:
        rows = run_saved(query, "top_holders", token=token, n=n)
    except Unpublished as e:
        out.skipped = f"not published ({e})"
        return out
    accounts = [str(r["account"]) for r in rows]
    views = node.views([(token, calldata("balanceOf(address)", a), head) for a in accounts])
    for r, view in zip(rows, views, strict=True):
        out.compare(head, f"holder {r['account']}", amount(r["balance"]), view or 0)
    return out


def check_holder_history(
    query: Query, node: Node, token: str, blocks: list[int], n: int
) -> Outcome:
    out = Outcome("holder_history", "top holders' balances vs balanceOf()", blocks)
    try:
        rows = run_saved(query, "holder_history", _in(blocks), token=token, n=n, every=1)
    except Unpublished as e:
        out.skipped = f"not published ({e})"
        return out
    views = node.views(
        [
            (token, calldata("balanceOf(address)", r["account"]), int(r["block_number"]))
            for r in rows
        ]
    )
    for r, view in zip(rows, views, strict=True):
        out.compare(
            int(r["block_number"]), f"holder {r['account']}", amount(r["balance"]), view or 0
        )
    return out


def check_validator_stake(
    query: Query, node: Node, lo: int, hi: int, samples: int, seed: int
) -> Outcome:
    """Every validator's stake at sampled window ends (within the synced range) against the
    staking contract's `validatorStake(id)` there; a validator the contract counts
    (`validatorCount()`, when it has that view) but the dataset lacks is a mismatch too."""
    out = Outcome("validator_stake", f"stake per validator vs {STAKE_VIEW}")
    try:
        ends = [
            int(r["window_end"])
            for r in query(
                "SELECT DISTINCT window_end FROM validator_stake "
                f"WHERE window_end BETWEEN {int(lo)} AND {int(hi)} ORDER BY window_end",
                {},
            )
        ]
    except NotFound as e:
        out.skipped = f"not published ({_unknown(e)})"
        return out
    if not ends:
        out.skipped = f"no window ends within the synced blocks {lo}-{hi}"
        return out
    out.blocks = sample_of(ends, samples, seed)
    if not node.has_view(STAKING_ADDRESS, calldata(STAKE_VIEW, 1), out.blocks[-1]):
        out.skipped = f"the staking contract at {STAKING_ADDRESS} has no {STAKE_VIEW} view"
        return out
    for end in out.blocks:
        trace = {
            int(r["validator_id"]): amount(r["stake"])
            for r in run_saved(query, "validator_stake", window_end=end)
        }
        count = _view_or_none(node, STAKING_ADDRESS, calldata("validatorCount()"), end)
        ids = sorted(set(trace) | set(range(1, (count or 0) + 1)))
        views = node.views([(STAKING_ADDRESS, calldata(STAKE_VIEW, v), end) for v in ids])
        for v, view in zip(ids, views, strict=True):
            if v not in trace and not view:
                continue  # a validator with no stake yet: nothing to publish
            out.compare(end, f"validator {v}", trace.get(v), view)
    return out


def _view_or_none(node: Node, to: str, data: str, block: int) -> int | None:
    """A view the contract may lack (then None)."""
    try:
        return node.view(to, data, block)
    except RpcError:
        return None


def verify_all(
    query: Query, node: Node, token: str | None, samples: int, seed: int, holders: int = 5
) -> tuple[tuple[int, int], list[Outcome]]:
    """Every check over the synced range, or CannotVerify when there is nothing to compare."""
    span = synced_range(query)
    if span is None:
        raise CannotVerify(
            "Trace holds no blocks yet (no published `blocks` dataset with rows): run trace demo"
        )
    lo, hi = span
    head = node.head()
    if head < hi:
        raise CannotVerify(
            f"the node is at block {head}, below Trace's last synced block {hi}: is it the "
            "chain Trace synced? (pass --rpc-url)"
        )
    blocks = sample_blocks(lo, hi, samples, seed)
    outcomes: list[Outcome] = []
    if token is None:
        for name in ("token_supply", "top_holders", "holder_history"):
            outcomes.append(Outcome(name, "", skipped="no token given (--token)"))
    else:
        token = token.lower()
        outcomes.append(check_supply(query, node, token, blocks))
        outcomes.append(check_top_holders(query, node, token, hi, holders))
        outcomes.append(check_holder_history(query, node, token, blocks, holders))
    outcomes.append(check_validator_stake(query, node, lo, hi, samples, seed))
    return span, outcomes
