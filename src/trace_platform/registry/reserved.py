"""The platform's reserved published names and the DAG that must produce them (kept apart
from registry/names.py so readers such as query/saved.py import it without the registry)."""

from __future__ import annotations

# The DAG the platform's own readers (saved queries, `trace verify`) trust: the Lite demo DAG
# (lite/demo/dag.py DAG_NAME; tests/unit/test_name_owners.py holds them equal).
PLATFORM_DAG = "monad_demo"
# What PLATFORM_DAG publishes (lite/dags/monad_demo.yaml), a superset of what the saved queries
# and `trace verify` read (the same unit test checks both).
RESERVED = frozenset(
    {
        "blocks",
        "transactions",
        "logs",
        "traces",
        "blocks_hot",
        "transactions_hot",
        "logs_hot",
        "traces_hot",
        "erc20_transfers",
        "staking_events",
        "token_supply",
        "token_balances",
        "validator_stake",
        "staking_concentration",
        "staking_periods",
        "delegator_stake",
        "delegator_concentration",
    }
)
