"""Alert truth from the node (issue 40): the demo DAG's large_transfer alerts are exactly the
ERC-20 Transfer logs at or above its threshold, read from the node itself with eth_getLogs —
none missing, none extra."""

from __future__ import annotations

from typing import Any

import yaml

from tests.support.devnet import DEMO
from tests.support.wait import wait_for
from trace_platform.chain import Rpc, topic0
from trace_platform.delivery.control import DeliveryControl
from trace_platform.identity.vault import vault_for

TRANSFER = topic0("Transfer(address,address,uint256)")


def threshold(dag_text: str | None = None) -> int:
    dag = yaml.safe_load(dag_text or DEMO.read_text())
    (rule,) = dag["jobs"]["large_transfers"]["config"]["rules"]
    return int(rule["args"]["threshold"])


def node_large_transfers(rpc: Rpc, head: int, at_least: int) -> set[str]:
    """`tx_hash:log_index` of every ERC-20 Transfer (two indexed addresses, one amount word)
    of at least `at_least`, by the node's own logs."""
    logs = rpc.call("eth_getLogs", {"fromBlock": "0x0", "toBlock": hex(head), "topics": [TRANSFER]})
    return {
        f"{log['transactionHash'].lower()}:{int(log['logIndex'], 16)}"
        for log in logs
        if len(log["topics"]) == 3
        and len(log["data"]) == 2 + 64
        and int(log["data"], 16) >= at_least
    }


def check_alert_truth(svc: Any, me: Any, rpc: Rpc, head: int) -> None:
    ctl = DeliveryControl(svc.pool, vault_for(svc.settings))
    wait_for(lambda: ctl.open_work(me) == 0, 120, "the alert pipeline settled")
    rows = svc.query.query(
        me, "SELECT dedupe_key FROM alert_events WHERE rule = 'large_transfer'"
    ).as_json()["rows"]
    got = [r[0] for r in rows]
    want = node_large_transfers(rpc, head, threshold())
    assert len(got) == len(set(got)), "an alert recorded twice"
    assert set(got) == want, (sorted(set(got) - want)[:5], sorted(want - set(got))[:5])
    assert want, "the devnet has no transfer at or above the threshold: the check checks nothing"
