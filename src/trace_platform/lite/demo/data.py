"""What the stores already hold for the demo: coverage of the current dataset versions (named
queries in db/sql/demo.sql), rows of saved queries and of the hot window through the Query
Service."""

from __future__ import annotations

from typing import Any

from trace_platform.chain import Rpc
from trace_platform.chain.identity import Mismatch, mismatches
from trace_platform.contract import ChainIdentity
from trace_platform.identity import Actor, lite_admin
from trace_platform.lite.demo.dag import DAG_NAME
from trace_platform.lite.demo.plan import DemoPlan
from trace_platform.query import pinned
from trace_platform.services import Services
from trace_platform.store.demo import ROWS_NOW_SQL, DemoStore

RAW = ("blocks", "transactions", "logs", "traces")
ANALYTICS = (
    "token_supply",
    "token_balances",
    "staking_periods",
    "validator_stake",
    "staking_concentration",
    "delegator_stake",
    "delegator_concentration",
)


def admin(svc: Services) -> Actor:
    with svc.pool.connection() as conn:
        return lite_admin(conn)


def coverage(svc: Services, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    with svc.pool.connection() as conn:
        rows = DemoStore(conn).current_coverage(names=list(names)).fetchall()
    return {r["dataset_name"]: r for r in rows}


def chain_changes(svc: Services, plan: DemoPlan) -> list[Mismatch]:
    """The synced ranges the node no longer confirms (their block hashes differ: a reorg, or a
    chain reset under the same id), or that were synced without hashes."""
    with svc.pool.connection() as conn:
        rows = DemoStore(conn).raw_identities(names=list(RAW)).fetchall()
    committed: dict[tuple[int, int], ChainIdentity | None] = {}
    for r in rows:
        key = (r["range_start"], r["range_end"])
        ident = (
            ChainIdentity(
                chain_id=r["chain_id"],
                first_hash=r["first_block_hash"],
                parent_hash=r["parent_hash"],
                last_hash=r["last_block_hash"],
            )
            if r["chain_id"] is not None
            else None
        )
        if key in committed and committed[key] != ident:
            ident = None  # the datasets disagree about this range: read it again
        committed[key] = ident
    with Rpc(plan.rpc_url) as rpc:
        return mismatches(rpc, committed)


def complete(svc: Services, plan: DemoPlan) -> bool:
    """The current versions already hold the whole range and the analytics over it."""
    found = coverage(svc, RAW + ANALYTICS)
    with svc.pool.connection() as conn:
        busy = DemoStore(conn).unfinished_tasks(dag=DAG_NAME).fetchone()
    if busy and busy["n"]:
        return False
    for name in RAW:
        r = found.get(name)
        if r is None or r["commits"] != plan.ranges:
            return False
        if r["lo"] != plan.from_block or r["hi"] != plan.to_block + 1:
            return False
    return all(found.get(n) and found[n]["commits"] for n in ANALYTICS)


def saved_rows(svc: Services, me: Actor, name: str, **params: Any) -> list[dict[str, Any]]:
    out = pinned.saved_query(svc.query, me, name, params).as_json()
    cols = [c["name"] for c in out["columns"]]
    return [dict(zip(cols, r, strict=True)) for r in out["rows"]]


def rows_now(svc: Services, me: Actor, dataset: str) -> int:
    """What a published dataset holds now, through the Query Service (for a window: not what
    passed through it)."""
    return int(svc.query.query(me, ROWS_NOW_SQL.format(dataset=dataset)).table[0][0].as_py())
